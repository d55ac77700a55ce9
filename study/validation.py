"""Checks on values that come from outside (importers' files and servers): the one place
where times out of range, numbers that are not finite and JSON the database cannot hold are
refused, by name, before anything is written.

Stored times are UTC epoch nanoseconds in a signed 64-bit column, so a time must fall in
[1970-01-01, 2262-01-01); a stored duration or measure must be a finite number.
"""

from __future__ import annotations

import json
import math
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import FlowtrialError

__all__ = [
    "EARLIEST", "LATEST", "InvalidInputError", "check_finite", "check_output_dir",
    "check_output_file", "check_time_ns", "decode_json", "load_json", "time_ns", "unstorable_value",
]

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
#: Exclusive; the last whole year before signed 64-bit epoch ns overflow (2262-04-11).
LATEST = datetime(2262, 1, 1, tzinfo=UTC)
_NS = 1_000_000_000
_LATEST_NS = round((LATEST - EARLIEST).total_seconds()) * _NS
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidInputError(FlowtrialError):
    """A value in the user's data that flowtrial cannot store (nothing was written)."""


def _range_hint() -> str:
    return f"times must fall between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC)"


def time_ns(dt: datetime, what: str) -> int:
    """Exact UTC epoch ns of ``dt`` (naive = UTC), refusing a time outside the stored range."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        in_range = EARLIEST <= dt < LATEST
    except OverflowError:  # an offset that pushes year 1 or 9999 over the edge
        in_range = False
    if not in_range:
        raise InvalidInputError(f"{what} {dt.isoformat()} is out of range: {_range_hint()}: "
                                "fix or remove it")
    d = dt - EARLIEST
    return (d.days * 86_400 + d.seconds) * _NS + d.microseconds * 1000


def check_time_ns(ns: int, what: str) -> int:
    """``ns`` (UTC epoch ns) if it lies in the stored range, else an error naming it."""
    if not 0 <= ns < _LATEST_NS:
        raise InvalidInputError(f"{what} {ns} ns since 1970 is out of range: {_range_hint()}: "
                                "fix or remove it")
    return ns


def check_finite(value: float, what: str) -> float:
    """``value`` if it is a finite number, else an error naming it."""
    if not math.isfinite(value):
        raise InvalidInputError(f"{what} is {value!r}, not a finite number: fix or remove it")
    return value


def unstorable_value(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first place in decoded JSON that cannot be stored as given, as (field path, what):
    a string (or key) with a lone UTF-16 surrogate (``"\\udfff"`` decodes to one; no encoding
    can write it), or a number that is not finite (``NaN``, ``Infinity``, ``1e999``: not JSON
    once written back). Iterative, so no nesting exhausts the stack."""
    todo: list[tuple[Any, str]] = [(value, path)]
    while todo:
        v, where = todo.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return where or "body", "invalid Unicode (a lone UTF-16 surrogate)"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return where or "body", "a number that is not finite (NaN or Infinity)"
        elif isinstance(v, dict):
            for k, x in v.items():
                sub = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and _SURROGATE.search(k):
                    return (where or "body"), "a key with invalid Unicode (a lone surrogate)"
                todo.append((x, sub))
        elif isinstance(v, list):
            todo.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
    return None


def decode_json(text: str, source: str, pos: int = 0) -> tuple[Any, int]:
    """The JSON value starting at ``pos`` in ``text`` and where it ends, refusing what the
    database cannot hold (:func:`unstorable_value`: numbers that are not finite — ``NaN``,
    ``Infinity``, ``1e999`` — and lone UTF-16 surrogates) and nesting deeper than Python's
    recursion limit. Syntax errors are :class:`ValueError` as with :mod:`json` (the caller
    says what the file should be)."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, pos)
    except RecursionError:
        raise InvalidInputError(f"{source}: JSON nested too deeply to read: check that this "
                                "is the file meant") from None
    bad = unstorable_value(value, "")
    if bad is not None:
        raise InvalidInputError(f"{source}: {bad[0]}: {bad[1]}: fix or remove it")
    return value, end


def load_json(text: str, source: str) -> Any:
    """One JSON document, with :func:`decode_json`'s refusals."""
    start = len(text) - len(text.lstrip())
    value, end = decode_json(text, source, start)
    if text[end:].strip():
        raise ValueError(f"extra data after the JSON document at character {end}")
    return value


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: Path, option: str) -> None:
    """Refuse, before any work, an output folder that cannot be written: an existing file
    (or other non-folder) in its place or above it, or a place this user cannot write."""
    if path.exists() and not path.is_dir():
        raise InvalidInputError(f"{option} {path}: a file is there, not a folder: name a new "
                                "or existing folder")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise InvalidInputError(f"{option} {path}: {base} is a file, not a folder: name a "
                                "folder elsewhere")
    if not os.access(base, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{option} {path}: cannot write in {base}: check its "
                                "permissions or name another folder")


def check_output_file(path: Path, option: str) -> None:
    """Refuse, before any work, an output file path that cannot be written: a folder in its
    place, a file where a parent folder must be, or a place this user cannot write."""
    if path.is_dir():
        raise InvalidInputError(f"{option} {path}: a folder, not a file: name the file to "
                                "write")
    check_output_dir(path.parent, option)
