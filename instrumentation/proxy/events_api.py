"""``POST /flowtrial/v1/events``: decisions and context events from the participant's client.

Body ``{"events": [{"kind", "ts"?, "cycle_id"?, "duration_s"?, "payload"?}, …]}`` (at most
1000 events). ``ts`` is an ISO-8601 time (UTC if it has no offset) or epoch seconds; it
defaults to the time the batch was received. A ``cycle_id`` must be one of the authenticated
participant's cycles — recorded, or still in flight on this proxy — else the whole batch is
refused with 422 and nothing is written. The answer ``{"accepted": n}`` comes once the rows
are durable. Parsing, validation and the ownership look-up run in an ingest process
(:mod:`.ingest`), never on the event loop; payload strings and sizes are capped
(:mod:`flowtrial.instrumentation.upload_caps`).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy import Engine, bindparam, text

from flowtrial.study.schema import Event
from flowtrial.study.storage import WriteBatch, utcnow

from ..request_body import unstorable_value
from ..upload_caps import UploadCaps, cap_payload
from .ingest import IngestBusy
from .refusal import Refusal
from .state import ProxyState

__all__ = ["ClientEvent", "EventBatch", "EventsRejected", "accept_events", "check_cycles",
           "event_rows", "parse_batch"]

MAX_EVENTS = 1000
MAX_PAYLOAD_DEPTH = 32
EventKind = Literal[
    "accept", "reject", "partial_accept", "edit", "focus_out", "focus_in", "afk_start",
    "afk_end", "task_start", "task_end", "custom",
]
_MIN_TS = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
_MAX_TS = datetime(2100, 1, 1, tzinfo=UTC).timestamp()
_NUMERIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion (no stack to exhaust)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d > MAX_PAYLOAD_DEPTH:
                break
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


class EventsRejected(Refusal):
    """A batch that cannot be written; ``param`` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str = "invalid_events") -> None:
        super().__init__(status, message, code, param)

    def __reduce__(self) -> Any:  # crosses the ingest process boundary
        return (EventsRejected, (self.status, self.message, self.param, self.code))


class ClientEvent(BaseModel):
    """One client event."""

    model_config = ConfigDict(extra="forbid")

    kind: EventKind
    ts: datetime | float | None = None
    cycle_id: str | None = Field(default=None, min_length=1, max_length=128)
    duration_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    payload: dict[str, Any] | None = None

    @field_validator("ts", "duration_s", mode="before")
    @classmethod
    def _no_coercion(cls, v: Any) -> Any:
        # JSON true/false or "123" are not times or durations (lax pydantic would take them).
        if isinstance(v, bool):
            raise ValueError("must be a number, not true/false")
        if isinstance(v, str) and _NUMERIC.match(v.strip()):
            raise ValueError("give epoch seconds as a JSON number, or an ISO-8601 time")
        return v

    @model_validator(mode="after")
    def _check(self) -> ClientEvent:
        if isinstance(self.ts, float | int) and not _MIN_TS <= float(self.ts) <= _MAX_TS:
            raise ValueError("ts: epoch seconds out of range (expected seconds since 1970)")
        if isinstance(self.ts, datetime):
            # Out-of-range times would overflow the 64-bit ns column: refuse them here (422).
            ts = self.ts if self.ts.tzinfo is not None else self.ts.replace(tzinfo=UTC)
            try:
                seconds = ts.timestamp()
            except (OverflowError, ValueError, OSError):
                seconds = float("nan")
            if not _MIN_TS <= seconds <= _MAX_TS:
                raise ValueError("ts: time out of range (expected a time between 2000 and 2100)")
        if self.payload and _depth(self.payload) > MAX_PAYLOAD_DEPTH:
            raise ValueError(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        if self.kind == "partial_accept":
            p = self.payload or {}
            chars, frac = p.get("accepted_chars"), p.get("accepted_fraction")
            ok_chars = isinstance(chars, int) and not isinstance(chars, bool) and chars >= 0
            ok_frac = isinstance(frac, int | float) and not isinstance(frac, bool) and (
                0.0 <= frac <= 1.0)
            if not (ok_chars or ok_frac):
                raise ValueError(
                    "partial_accept needs payload.accepted_chars (integer >= 0) or "
                    "payload.accepted_fraction (0..1)"
                )
        if self.kind in ("focus_out", "focus_in") and self.payload:
            for key in ("app", "category"):
                if key in self.payload and not isinstance(self.payload[key], str):
                    raise ValueError(f"payload.{key} must be a string")
        return self

    def ts_ns(self, received_ns: int) -> int:
        """The event time as UTC epoch ns."""
        ts = self.ts
        if ts is None:
            return received_ns
        if isinstance(ts, datetime):
            if ts.tzinfo is None:
                ts = ts.replace(tzinfo=UTC)
            delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
            return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
        return round(float(ts) * 1e9)


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[ClientEvent] = Field(max_length=MAX_EVENTS)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part) in ("datetime", "float", "function-after[_check()]") or "[" in str(part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _precap(data: Any, caps: UploadCaps | None) -> Any:
    """Payloads capped before validation, so a huge one costs no more than the cap to check
    (and a batch over :data:`MAX_EVENTS` is refused before anything is walked)."""
    if caps is None or not isinstance(data, dict) or not isinstance(data.get("events"), list):
        return data
    if len(data["events"]) > MAX_EVENTS:
        raise EventsRejected(422, f"events: at most {MAX_EVENTS} events per batch: send the "
                                  "rest in another request", "events")
    for e in data["events"]:
        if isinstance(e, dict) and isinstance(e.get("payload"), dict):
            e["payload"] = cap_payload(e["payload"], caps)
    return data


def parse_batch(body: bytes, caps: UploadCaps | None = None) -> EventBatch:
    """Decode and validate a batch (400 for bad JSON, 422 for bad events); with ``caps``,
    payloads are capped first (:func:`~..upload_caps.cap_payload`)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventsRejected(400, f"the request body is not valid JSON: {exc}", None,
                             "invalid_json") from None
    except RecursionError:
        raise EventsRejected(400, "the request body is JSON nested too deeply to read: send "
                                  "flat event objects", None, "invalid_json") from None
    data = _precap(data, caps)
    bad = unstorable_value(data)
    if bad is not None:
        where, what = bad
        status = 400 if "Unicode" in what else 422
        raise EventsRejected(status, f"{where}: {what}: nothing of this batch was written",
                             where, "invalid_unicode" if status == 400 else "invalid_number")
    try:
        return EventBatch.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _loc(tuple(err["loc"]))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err["type"] == "too_long":
            msg = f"at most {MAX_EVENTS} events per batch: send the rest in another request"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise EventsRejected(422, f"{loc}: {msg}{more}" if loc else msg + more, loc or None
                             ) from None


_OWNERS = text("SELECT id, participant_id FROM cycles WHERE id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)


def check_cycles(engine: Engine, pid: str, batch: EventBatch, own_open: frozenset[str]
                 ) -> None:
    """Refuse the batch unless every ``cycle_id`` is one of ``pid``'s cycles: in flight on
    this proxy (``own_open``) or recorded."""
    wanted = {e.cycle_id for e in batch.events if e.cycle_id}
    owners = {c: pid for c in wanted & own_open}
    rest = sorted(wanted - owners.keys())
    if rest:
        with engine.connect() as conn:
            owners.update({r[0]: r[1] for r in conn.execute(_OWNERS, {"ids": rest})})
    for i, e in enumerate(batch.events):
        if e.cycle_id and owners.get(e.cycle_id) != pid:
            raise EventsRejected(
                422, f"events[{i}].cycle_id: {e.cycle_id!r} is not one of your cycles "
                     "(use the x-flowtrial-cycle-id header of your own request); nothing "
                     "of this batch was written",
                f"events[{i}].cycle_id", "unknown_cycle")


def event_rows(pid: str, batch: EventBatch, received_ns: int, source: str = "client"
               ) -> list[dict[str, Any]]:
    """The batch's ``events`` rows (payloads capped by :func:`parse_batch`)."""
    now = utcnow()
    return [
        {
            "participant_id": pid,
            "cycle_id": e.cycle_id,
            "kind": e.kind,
            "ts_ns": e.ts_ns(received_ns),
            "duration_s": e.duration_s,
            "source": source,
            "payload_json": json.dumps(e.payload, ensure_ascii=False)
            if e.payload is not None else None,
            "dedupe_key": None,
            "received_at": now,
        }
        for e in batch.events
    ]


async def accept_events(state: ProxyState, pid: str, body: bytes, *,
                        source: str = "client") -> int:
    """Validate, check ownership and cap in an ingest process, then write durably (bulk);
    returns the number of events written. Raises :class:`EventsRejected`, or
    :class:`~.ingest.IngestBusy` when ingest is saturated."""
    from .ingest import ingest_of
    from .ingest_jobs import events_job

    ingest = ingest_of(state)
    own_open = frozenset(c for c, p in state.open_cycles.items() if p == pid)
    rows = await ingest.run(pid, events_job, ingest.context, pid, body, own_open,
                            time.time_ns(), source)
    if rows:
        try:
            await ingest.store(pid, WriteBatch(Event, rows))
        except IngestBusy:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, nothing claimed
            raise EventsRejected(503, f"the events could not be recorded ({type(exc).__name__})"
                                 ": check the proxy's database", None, "recording_failed"
                                 ) from None
        state.turns.note_events(pid, rows)  # a person acted: the typing-speed rule yields
    return len(rows)
