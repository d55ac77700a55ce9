"""From OTLP records to linked ``events`` rows: the mapping of each agent, then the link of
each event to the participant's cycle it belongs to.

Linking (by participant, time and model; an exact id first):

- ``request`` events (the agent's own timing of a model request) take the cycle whose id is
  one of the request ids the agent saw, else the cycle of the same model whose request time
  is nearest the event's start, within :data:`REQUEST_TOLERANCE_S`; each cycle at most once.
- ``before`` events (decisions, tool runs, waits, turn ends) take the latest cycle answered
  before them, within :data:`HORIZON_S` (the answer that proposed the tool).
- ``after`` events (prompts) take the first cycle requested after them, within
  :data:`PROMPT_TOLERANCE_S`.

``before`` and ``after`` skip ``side`` calls: Claude Code's interactive title request goes
out with the prompt and may end after the answer that proposed the tool, and neither
proposes tools nor is the prompt's request.

Rows are keyed ``otel:<participant>:<record digest>``: a record sent twice (an exporter's
retry, or imported from a file after it arrived live) is written once.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection

from flowtrial.study.storage import Database

from . import claude_code, codex, gemini_cli
from .mapped import Link, MappedEvent, custom_event
from .otlp import OtelRecord

__all__ = [
    "HORIZON_S",
    "REQUEST_TOLERANCE_S",
    "CycleSpan",
    "event_rows",
    "link_events",
    "load_cycles",
    "map_records",
    "prepare_rows",
    "relink",
]

Mapper = Callable[[OtelRecord, bool], list[MappedEvent] | None]
MAPPERS: tuple[tuple[str, Mapper], ...] = (
    (claude_code.AGENT, claude_code.map_record),
    (codex.AGENT, codex.map_record),
    (gemini_cli.AGENT, gemini_cli.map_record),
)
REQUEST_TOLERANCE_S = 2.0  # agent's request start vs the proxy's t_request (same machine: ms)
PROMPT_TOLERANCE_S = 120.0  # prompt → the first request it causes
HORIZON_S = 3600.0  # a decision may come long after the answer that proposed the tool
_NS = 1_000_000_000


def map_records(records: Iterable[OtelRecord], full: bool) -> list[MappedEvent]:
    """Every record as flowtrial events (unknown ones as ``custom``)."""
    out: list[MappedEvent] = []
    for rec in records:
        for _agent, mapper in MAPPERS:
            mapped = mapper(rec, full)
            if mapped is not None:
                out.extend(mapped)
                break
        else:
            agent_of = next((a for a, _ in MAPPERS if rec.name.startswith(a + ".")), None)
            out.append(custom_event(rec, full, agent_of))
    return out


@dataclass(frozen=True, slots=True)
class CycleSpan:
    """A cycle on the wall clock (UTC epoch ns)."""

    id: str
    model: str | None
    start_ns: int
    end_ns: int
    side: bool = False  # a side call (title, summary): only its own request timing links


_CYCLES = text(
    "SELECT id, model, wall_anchor_ns + (t_request_ns - mono_anchor_ns) AS start_ns, "
    "wall_anchor_ns + (COALESCE(t_done_ns, t_last_sent_ns, t_request_ns) - mono_anchor_ns) "
    "AS end_ns, request_kind FROM cycles WHERE participant_id = :pid "
    "AND wall_anchor_ns + (t_request_ns - mono_anchor_ns) BETWEEN :lo AND :hi "
    "ORDER BY start_ns")


def load_cycles(conn: Connection, pid: str, events: Sequence[MappedEvent]) -> list[CycleSpan]:
    """The participant's cycles around ``events`` (sorted by request time)."""
    if not events:
        return []
    lo = min(e.start_ns or e.ts_ns for e in events) - round(HORIZON_S * _NS)
    hi = max(e.ts_ns for e in events) + round(PROMPT_TOLERANCE_S * _NS)
    return [CycleSpan(r[0], r[1], int(r[2]), int(r[3]), r[4] == "side")
            for r in conn.execute(_CYCLES, {"pid": pid, "lo": lo, "hi": hi})]


def _models_agree(a: str | None, b: str | None) -> bool:
    return not a or not b or a == b


def link_events(events: Sequence[MappedEvent], cycles: Sequence[CycleSpan]) -> None:
    """Set ``extra["cycle_id"]`` on each event that belongs to one of ``cycles``."""
    by_id = {c.id: c for c in cycles}
    starts = [c.start_ns for c in cycles]
    main = [c for c in cycles if not c.side]  # what decisions and prompts may link to
    main_starts = [c.start_ns for c in main]
    taken: set[str] = set()
    tol = round(REQUEST_TOLERANCE_S * _NS)
    # Request events: exact ids first, then the nearest starts, greedily (best pairs first).
    pairs: list[tuple[int, int, str]] = []
    for i, e in enumerate(events):
        if e.link != "request":
            continue
        exact = next((x for x in e.ids if x in by_id), None)
        if exact is not None:
            e.extra["cycle_id"] = exact
            taken.add(exact)
            continue
        if e.start_ns is None:
            continue
        lo = bisect.bisect_left(starts, e.start_ns - tol)
        hi = bisect.bisect_right(starts, e.start_ns + tol)
        pairs += [(abs(c.start_ns - e.start_ns), i, c.id) for c in cycles[lo:hi]
                  if _models_agree(c.model, e.model)]
    for _, i, cid in sorted(pairs):
        if cid not in taken and "cycle_id" not in events[i].extra:
            events[i].extra["cycle_id"] = cid
            taken.add(cid)
    horizon, prompt_tol = round(HORIZON_S * _NS), round(PROMPT_TOLERANCE_S * _NS)
    for e in events:
        if e.link == "before":
            # The latest request sent before it: an agent may take its decision as soon as
            # the tool call has arrived, before the answer's final event ends the cycle (the
            # answer that ended before it would then be an earlier one, or none).
            j = bisect.bisect_right(main_starts, e.ts_ns) - 1
            if j >= 0 and e.ts_ns - main[j].end_ns <= horizon:
                e.extra["cycle_id"] = main[j].id
        elif e.link == "after":
            j = bisect.bisect_left(main_starts, e.ts_ns)
            if j < len(main) and main_starts[j] - e.ts_ns <= prompt_tol:
                e.extra["cycle_id"] = main[j].id


def event_rows(pid: str, events: Iterable[MappedEvent], received_at: datetime
               ) -> list[dict[str, Any]]:
    """``events`` rows (``source = "otel"``), deduplicated by record digest."""
    rows: dict[str, dict[str, Any]] = {}
    for e in events:
        key = f"otel:{pid}:{e.digest}:{e.kind}"
        rows[key] = {
            "participant_id": pid,
            "cycle_id": e.extra.get("cycle_id"),
            "kind": e.kind,
            "ts_ns": e.ts_ns,
            "duration_s": e.duration_s,
            "source": "otel",
            "payload_json": json.dumps(e.payload, ensure_ascii=False, default=str),
            "dedupe_key": key,
            "received_at": received_at,
        }
    return list(rows.values())


#: How a stored event finds its cycle (the same rule its mapping gave it).
KIND_LINK: dict[str, Link] = {
    "turn_start": "after", "api_request": "request", "accept": "before", "reject": "before",
    "partial_accept": "before", "tool_result": "before", "agent_wait": "before",
    "turn_end": "before",
}
_UNLINKED = text(
    "SELECT id, kind, ts_ns, duration_s, payload_json FROM events WHERE participant_id = :pid "
    "AND source = 'otel' AND cycle_id IS NULL AND kind IN :kinds AND ts_ns BETWEEN :lo AND :hi"
).bindparams(bindparam("kinds", expanding=True))
_TAKEN = text(
    "SELECT DISTINCT cycle_id FROM events WHERE participant_id = :pid AND source = 'otel' "
    "AND kind = 'api_request' AND cycle_id IS NOT NULL AND ts_ns BETWEEN :lo AND :hi")
_SET_CYCLE = text("UPDATE events SET cycle_id = :c WHERE id = :i AND cycle_id IS NULL")


def relink(conn: Connection, pid: str, lo_ns: int, hi_ns: int) -> int:
    """Link the participant's stored telemetry events that found no cycle when they arrived
    (a prompt comes before its request is recorded); returns how many were linked."""
    found = conn.execute(_UNLINKED, {"pid": pid, "kinds": sorted(KIND_LINK), "lo": lo_ns,
                                     "hi": hi_ns}).all()
    if not found:
        return 0
    events: list[MappedEvent] = []
    for row_id, kind, ts_ns, duration_s, payload_json in found:
        payload = json.loads(payload_json or "{}")
        link = KIND_LINK[kind]
        start = ts_ns - round(duration_s * _NS) if duration_s is not None else None
        events.append(MappedEvent(kind, int(ts_ns), payload, duration_s, link,
                                  payload.get("model"), start, extra={"row": row_id}))
    taken = {r[0] for r in conn.execute(_TAKEN, {"pid": pid, "lo": lo_ns - round(
        HORIZON_S * _NS), "hi": hi_ns + round(HORIZON_S * _NS)})}
    cycles = [c for c in load_cycles(conn, pid, events) if c.id not in taken]
    link_events(events, cycles)
    n = 0
    for e in events:
        if "cycle_id" in e.extra:
            n += conn.execute(_SET_CYCLE, {"c": e.extra["cycle_id"], "i": e.extra["row"]}
                              ).rowcount
    return n


def prepare_rows(database: Database, pid: str, records: Iterable[OtelRecord], full: bool,
                 now_ns: int, received_at: datetime) -> list[dict[str, Any]]:
    """Map, link (reading the participant's cycles) and turn into rows; a record without a
    time takes ``now_ns``."""
    events = map_records(records, full)
    for e in events:
        if e.ts_ns <= 0:
            e.ts_ns = now_ns
    if any(e.link != "none" for e in events):
        with database.engine.connect() as conn:
            link_events(events, load_cycles(conn, pid, events))
    if events:  # earlier events whose cycle was still in flight when they came
        lo = min(e.ts_ns for e in events) - round(HORIZON_S * _NS)
        with database.engine.begin() as conn:
            relink(conn, pid, lo, max(e.ts_ns for e in events))
    return event_rows(pid, events, received_at)
