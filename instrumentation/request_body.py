"""Reading a request body under a size limit (the proxy's endpoints and the Continue one)."""

from __future__ import annotations

import math
import re
from typing import Any

from starlette.requests import Request

__all__ = ["BodyTooLarge", "read_body", "unstorable_value"]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyTooLarge(Exception):
    """The body is over the limit (the caller answers 413 and writes nothing)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than ``limit`` bytes: by its declared length before reading any,
    else as soon as more has arrived (so an oversized body is never held in memory whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def unstorable_value(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first place in decoded JSON that cannot be stored as given, as (field path, what):
    a string (or key) with a lone UTF-16 surrogate (``"\\udfff"`` decodes to one; no encoding
    can write it), or a number that is not finite (``NaN``, ``Infinity``, ``1e999``: not JSON
    once written back). Iterative, so no nesting exhausts the stack."""
    # Paths are built only for the value reported: a (parent, key) chain per pending item.
    todo: list[tuple[Any, Any]] = [(value, None)]
    while todo:
        v, at = todo.pop()
        if isinstance(v, str):
            if _LONE_SURROGATE.search(v):
                return _path(at, path) or "body", "invalid Unicode (a lone UTF-16 surrogate)"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return (_path(at, path) or "body",
                        "a number that is not finite (NaN or Infinity)")
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and _LONE_SURROGATE.search(k):
                    return (_path(at, path) or "body",
                            "a key with invalid Unicode (a lone surrogate)")
                if isinstance(x, str | float | dict | list):
                    todo.append((x, (at, k)))
        elif isinstance(v, list):
            todo.extend((x, (at, i)) for i, x in enumerate(v)
                        if isinstance(x, str | float | dict | list))
    return None


def _path(at: Any, root: str) -> str:
    parts: list[Any] = []
    while at is not None:
        at, key = at
        parts.append(key)
    out = root
    for key in reversed(parts):
        out = f"{out}[{key}]" if isinstance(key, int) else (f"{out}.{key}" if out else str(key))
    return out
