"""One cycle's record, and making it durable before the client sees the end of the answer.

:class:`CycleRecord` collects what the relay observes (timeline, targets, tokens, content);
:meth:`Recorder.record` submits it as a ``cycles`` row (built, fingerprints included, in the
writer thread rather than on the event loop) to the shared
:class:`~flowtrial.study.storage.RecordWriter` (group commit: concurrent streams share one
transaction) and returns once the row is committed — or raises, in which case the relay must not
send the final event ("nothing the client saw complete is lost").

Definitions (ms from the monotonic timeline, see docs/concepts/timeline.md):
experienced_ttft_ms = t_first_sent − t_request; generation_wait_ms = t_last_sent − t_request;
achieved_tps = (output tokens after the first) / (t_last_sent − t_first_sent). Output is
answer text and tool-call arguments (a tool-only answer has a timeline too); ``tokens_sent``
counts both, the recorded content is the text only.
``t_done_ns`` is when the relay submitted the row (the stream had ended upstream and every
output token had been written); the final event follows as soon as the commit is durable.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from flowtrial.study.schema import Cycle
from flowtrial.study.storage import LazyRow, RecordWriter, WriteBatch

from ..fingerprints import fingerprint_json
from .health import DatabaseGate, DatabaseUnavailable, describe, is_database_failure
from .protocols.base import ProtocolAdapter
from .shaping import VIOLATION_TOLERANCE_MS, Target

__all__ = ["TEXT_REPLACED_FLAG", "CycleRecord", "Recorder", "storable"]

log = logging.getLogger("flowtrial.proxy")


#: ``cycles`` columns that :meth:`CycleRecord.row` computes (or the recorder sets:
#: ``recorded_by``). Every other column is a :class:`CycleRecord` field of the same name,
#: made from the table's own declaration (``study/schema.py``: name, type, default) and
#: stored as it is: a new such column is declared in the schema (and its migration) only.
_COMPUTED = frozenset({
    "shaped", "target_ttft_ms", "target_tps", "target_jitter", "target_delivery",
    "experienced_ttft_ms", "generation_wait_ms", "achieved_tps", "violation", "violation_ms",
    "tokens_prompt", "tokens_completion", "usage_exact", "prompt_fingerprint",
    "content_fingerprint", "prompt_text", "content_text", "content_chars", "recorded_by"})
#: Where a record starts other than at its column's default (the relay fills them in).
_STARTS: dict[str, Any] = {"arm": "", "tokens_sent": 0}


@dataclass(slots=True, kw_only=True)
class _RecordCore:
    """What a cycle record holds beyond its stored columns, and how it becomes a row."""

    prompt_text: str = ""  # the person's prompt, stored per ``capture`` (row())
    target: Target | None = None
    first_late_ns: int | None = None  # first output token: written − due
    last_late_ns: int | None = None  # last output token written so far: written − due
    usage: dict[str, Any] | None = None
    content_parts: list[str] = field(default_factory=list)


# CycleRecord's methods: defined here because the class itself is made from the table below.
def _sent(self: CycleRecord, t_ns: int, first_due: int | None, last_due: int | None) -> None:
    """Output tokens due at ``first_due``..``last_due`` were written at ``t_ns``."""
    if self.t_first_sent_ns is None:
        self.t_first_sent_ns = t_ns
        if first_due is not None:
            self.first_late_ns = t_ns - first_due
    self.t_last_sent_ns = t_ns
    if last_due is not None:
        self.last_late_ns = t_ns - last_due


def _row(self: CycleRecord, capture: str) -> dict[str, Any]:
    """The ``cycles`` row; content per the study's ``capture.content``."""
    t0 = self.t_request_ns
    ttft = wait = tps = None
    if self.t_first_sent_ns is not None:
        ttft = (self.t_first_sent_ns - t0) / 1e6
    if self.t_last_sent_ns is not None:
        wait = (self.t_last_sent_ns - t0) / 1e6
        span = self.t_last_sent_ns - (self.t_first_sent_ns or self.t_last_sent_ns)
        sent = self.tokens_sent or 0
        if span > 0 and sent > 1:
            tps = (sent - 1) / (span / 1e9)
    prompt_tok, completion_tok = ProtocolAdapter.usage_counts(self.usage)
    exact = completion_tok is not None
    target = self.target
    violation_ms = None
    lates = [x for x in (self.first_late_ns, self.last_late_ns) if x is not None]
    if target is not None and lates:
        violation_ms = max(0.0, max(lates) / 1e6)
    content, bad_content = storable("".join(self.content_parts))
    # Not scanned when not stored: a 10 MB prompt's scan holds the GIL (and the loop).
    prompt, bad_prompt = storable(self.prompt_text) if capture != "none" else ("", False)
    # Every column field is stored as it is; the rest are computed here.
    row: dict[str, Any] = {name: getattr(self, name) for name in _COPIED}
    row.update({
        "t_request_ns": t0,
        "shaped": target is not None,
        "target_ttft_ms": target.ttft_ms if target else None,
        "target_tps": target.tokens_per_second if target else None,
        "target_jitter": target.jitter if target else None,
        "target_delivery": target.delivery if target else None,
        "experienced_ttft_ms": ttft,
        "generation_wait_ms": wait,
        "achieved_tps": tps,
        "violation": violation_ms is not None and violation_ms > VIOLATION_TOLERANCE_MS,
        "violation_ms": violation_ms,
        "tokens_prompt": prompt_tok,
        "tokens_completion": completion_tok if exact else self.tokens_sent,
        "usage_exact": exact,
        "prompt_fingerprint": None,
        "content_fingerprint": None,
        "prompt_text": None,
        "content_text": None,
        "content_chars": len(content),
    })
    replaced = [name for name, bad in (("prompt", bad_prompt), ("content", bad_content))
                if bad and capture != "none"]
    if capture in ("fingerprint", "full"):
        row["prompt_fingerprint"] = fingerprint_json(prompt)
        row["content_fingerprint"] = fingerprint_json(content)
    if capture == "full":
        row["prompt_text"] = prompt
        row["content_text"] = content
    if capture == "none":
        row["content_chars"] = None
    for key, value in row.items():
        if isinstance(value, str) and key not in ("prompt_text", "content_text"):
            row[key], bad = storable(value)
            if bad and key != "error":
                replaced.append(key)
    if replaced:  # flagged where the analyst reads what went wrong with a cycle
        note = (f"{TEXT_REPLACED_FLAG}: {', '.join(replaced)} had text that cannot be "
                "stored (lone UTF-16 surrogates or NUL), kept with U+FFFD in its place")
        row["error"] = f"{row['error']}; {note}" if row["error"] else note
    return row


def _column_fields() -> list[tuple[str, Any, Any]]:
    """(name, type, field) of each stored-as-is column, from the ``cycles`` table."""
    out = []
    for name, info in Cycle.model_fields.items():
        if name in _COMPUTED:
            continue
        if name in _STARTS:
            default = field(default=_STARTS[name])
        elif info.is_required():
            default = field()
        else:
            default = field(default=info.default)
        out.append((name, info.annotation, default))
    return out


if TYPE_CHECKING:  # the columns' names and types are the table's (one declaration)
    # (ignore: prompt_text is ``str`` here, the text the row's ``prompt_text`` is made from)
    class CycleRecord(_RecordCore, Cycle):  # type: ignore[misc]
        """What one request did, filled in as it happens."""

        sent = _sent
        row = _row
else:
    # One flat class (no base at run time): its attribute reads stay as fast as a plain
    # dataclass's on the proxy's hot path.
    CycleRecord = make_dataclass(
        "CycleRecord", [(f.name, f.type, f) for f in fields(_RecordCore)] + _column_fields(),
        slots=True, kw_only=True,
        namespace={"__module__": __name__, "sent": _sent, "row": _row,
                   "__doc__": "What one request did, filled in as it happens: a field per "
                              "stored-as-is ``cycles`` column, plus :class:`_RecordCore`."})

#: The ``cycles`` columns a CycleRecord field of the same name fills as it is.
_COPIED = tuple(name for name, _, _ in _column_fields())

#: Lone UTF-16 surrogates (JSON's "\udfff" decodes to one; no encoding can store it) and NUL
#: (PostgreSQL text cannot hold it).
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")
#: Starts the note in ``cycles.error`` when stored text had characters replaced.
TEXT_REPLACED_FLAG = "text_replaced"


def storable(text: str) -> tuple[str, bool]:
    """``text`` with what no database can store replaced by U+FFFD, and whether any was."""
    if _UNSTORABLE.search(text) is None:
        return text, False
    return _UNSTORABLE.sub("\ufffd", text), True


def _cycle_row(rec: CycleRecord, capture: str, recorded_by: str | None) -> dict[str, Any]:
    """The cycle's row (fingerprints included), built by the writer thread (``LazyRow``)."""
    row = rec.row(capture)
    row["recorded_by"] = recorded_by
    return row


class Recorder:
    """Submits cycle rows to the writer and waits until they are durable."""

    def __init__(self, writer: RecordWriter, capture: str,
                 recorded_by: str | None = None) -> None:
        self.writer = writer
        self.capture = capture
        #: Which proxy process records (cycles.recorded_by): several may share one database.
        self.recorded_by = recorded_by
        self.recorded = 0
        self.failed = 0
        #: Smoothed submit-to-durable time; non-streaming answers submit this much ahead.
        self.commit_ewma_ns = 5_000_000
        #: Trips when the database fails: new requests are refused, failed rows held.
        self.gate = DatabaseGate(writer)

    def _lazy_row(self, rec: CycleRecord) -> LazyRow:
        """The cycle's one-row batch, built later by the writer thread."""
        return LazyRow(partial(_cycle_row, rec, self.capture, self.recorded_by))

    async def record(self, rec: CycleRecord, also: Sequence[WriteBatch] = ()) -> None:
        """Make ``rec`` durable (with ``also``, its turn's row and any revision, in the same
        transaction);
        raises if the write failed (the caller must fail loudly).

        A failure that is the database's trips the gate and keeps the row (marked: its client
        got an error, not the end of the answer) to be written once the database is back;
        while the gate is tripped the write is not even attempted."""
        gate = self.gate
        if not gate.ok:
            self.failed += 1
            self._hold(rec)
            raise DatabaseUnavailable(gate.reason or "the study database is unavailable")
        batch = WriteBatch(Cycle, self._lazy_row(rec))
        t0 = time.monotonic_ns()
        try:
            await asyncio.wrap_future(self.writer.submit(batch, *also))
        except Exception as exc:
            self.failed += 1
            if is_database_failure(exc):
                gate.trip(exc)
                self._hold(rec)
            else:
                # Not the database's fault (a row that could not be built or was refused):
                # held and retried all the same, counted, and health says "degraded".
                gate.row_failed(exc)
                self._hold(rec, "the cycle's row could not be written at first ("
                                f"{describe(exc)}): the client got an error instead of its "
                                "end; written on retry")
            raise
        self.commit_ewma_ns += (time.monotonic_ns() - t0 - self.commit_ewma_ns) // 8
        self.recorded += 1

    def _hold(self, rec: CycleRecord, note: str | None = None) -> None:
        if rec.status == "ok":
            rec.status = "error"
            note = note or ("the database failed as the answer ended: the client got an error "
                            "instead of its end; written once the database was back")
        else:
            note = note or "written late: the database failed as the cycle ended"
        rec.error = f"{rec.error}; {note}" if rec.error else note
        # A fresh lazy row (built when retried, so it has what the relay sets meanwhile, e.g.
        # the 503 sent instead of a whole answer), idempotent in case the failed commit did
        # land after all.
        self.gate.hold(WriteBatch(Cycle, self._lazy_row(rec), ignore_conflicts=True))

    def lead_ns(self) -> int:
        """How long before a planned release to submit its row (2x the usual commit time,
        10-200 ms)."""
        return min(200_000_000, max(10_000_000, 2 * self.commit_ewma_ns))
