"""The work of each upload, as run in an ingest process (:mod:`.ingest`): parse, validate,
cap, map and link, returning the rows to store. Module-level functions of picklable
arguments; their database reads use a per-process engine."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from flowtrial.study.storage import Database, create_db_engine, utcnow

from ..upload_caps import TRUNCATED_KEY, UploadCaps, cap_payload, time_out_of_range

__all__ = [
    "ROW_OVERHEAD", "TRUNCATED_KEY", "ContinueResult", "JobContext", "OtlpResult",
    "continue_job", "events_job", "otlp_job", "row_bytes", "stored_since", "worker_init",
]

_ENGINES: dict[str, Engine] = {}
#: Bytes a stored event costs besides its payload (columns, index entries), for the quota.
ROW_OVERHEAD = 128


@dataclass(frozen=True)
class JobContext:
    """What every job needs: the database (its URL) and the caps."""

    database_url: str
    caps: UploadCaps

    def database(self) -> Database:
        engine = _ENGINES.get(self.database_url)
        if engine is None:
            engine = _ENGINES[self.database_url] = create_db_engine(self.database_url)
        return Database(self.database_url, engine)


def worker_init() -> None:
    """Start of an ingest process: below the proxy in the scheduler's eyes (the proxy's loop
    releases tokens on time; ingest may wait), and deaf to the terminal's Ctrl-C (the proxy
    shuts the pool down)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A job runs a few frames deeper than the proxy's loop did: keep the nesting JSON may have.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1200))
    try:
        os.nice(10)
    except OSError:
        pass


def stored_since(ctx: JobContext, pid: str, since: datetime) -> int:
    """Bytes of uploads stored for ``pid`` since ``since`` (the per-day quota's start)."""
    sql = text("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload_json)), 0) FROM events "
               "WHERE participant_id = :pid AND received_at >= :since")
    with ctx.database().engine.connect() as conn:
        n, size = conn.execute(sql, {"pid": pid, "since": since}).one()
    return int(size or 0) + ROW_OVERHEAD * int(n or 0)


def row_bytes(rows: list[dict[str, Any]]) -> int:
    """What ``rows`` count against the per-day quota."""
    return sum(len(r.get("payload_json") or "") + ROW_OVERHEAD for r in rows)


# -- event API ---------------------------------------------------------------------------
def events_job(ctx: JobContext, pid: str, body: bytes, own_open: frozenset[str],
               received_ns: int, source: str) -> list[dict[str, Any]]:
    """``POST /flowtrial/v1/events``: the batch's rows (raises ``EventsRejected``)."""
    from .events_api import check_cycles, event_rows, parse_batch

    batch = parse_batch(body, ctx.caps)
    check_cycles(ctx.database().engine, pid, batch, own_open)
    return event_rows(pid, batch, received_ns, source)


# -- OTLP --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OtlpResult:
    rows: list[dict[str, Any]]
    as_json: bool
    rejected: int  # records over max_records_per_post (OTLP partial_success)
    message: str = ""
    dropped: int = 0  # a team's records naming no one (OTLP partial_success too)


def _capped_rows(rows: list[dict[str, Any]], caps: UploadCaps) -> list[dict[str, Any]]:
    for r in rows:
        raw = r.get("payload_json")
        if raw and len(raw) > min(caps.max_value_bytes, caps.max_payload_bytes):
            r["payload_json"] = json.dumps(cap_payload(json.loads(raw), caps),
                                           ensure_ascii=False)
    return rows


def otlp_job(ctx: JobContext, pid: str, signal_name: str, body: bytes,
             content_type: str | None, content_encoding: str | None, full: bool,
             now_ns: int, team: Any = None) -> OtlpResult:
    """``POST /flowtrial/otlp/v1/<signal>``: decode (inflating against the cap), keep at
    most ``max_records_per_post`` records, refuse times outside 2000–2100 by name, map per
    the capture policy, cap payloads, link to cycles. Raises ``OtlpDecodeError``."""
    from ..telemetry.ingest import prepare_rows
    from ..telemetry.otlp import OtlpDecodeError, decode_request, records

    caps = ctx.caps
    message, as_json = decode_request(signal_name, body, content_type,  # type: ignore[arg-type]
                                      content_encoding, caps.max_inflated_bytes)
    recs = records(signal_name, message)  # type: ignore[arg-type]
    rejected = max(0, len(recs) - caps.max_records_per_post)
    recs = recs[:caps.max_records_per_post]
    for i, rec in enumerate(recs):
        for field_name, ns in (("timeUnixNano", rec.time_ns), ("endTimeUnixNano", rec.end_ns)):
            if ns is not None and time_out_of_range(ns):
                raise OtlpDecodeError(
                    f"{signal_name} record {i} ({rec.name or 'unnamed'}): {field_name} {ns} "
                    "is outside 2000-2100 (UTC epoch nanoseconds): nothing of this request "
                    "was written")
    dropped = 0
    if team is not None:  # a team study's token: split by person (their pseudonyms)
        from ..telemetry.team import team_rows

        rows, dropped = team_rows(ctx.database(), team, recs, full, now_ns, utcnow())
    else:
        rows = prepare_rows(ctx.database(), pid, recs, full, now_ns, utcnow())
    note = (f"{rejected} record(s) over proxy.max_records_per_post "
            f"({caps.max_records_per_post}) were not stored: export smaller batches"
            if rejected else "")
    return OtlpResult(_capped_rows(rows, caps), as_json, rejected, note, dropped)


# -- ActivityWatch uploads --------------------------------------------------------------
@dataclass(frozen=True)
class ActivityResult:
    """The rows of an uploaded export and its per-bucket receipt."""

    rows: list[dict[str, Any]]
    buckets: list[dict[str, Any]]


def activity_job(ctx: JobContext, pid: str, body: bytes, source: str,
                 keep_titles: bool) -> ActivityResult:
    """``POST /flowtrial/v1/activitywatch`` and the participant page's upload: parse the
    export, keep the participant's working apps' policy, map it to ``events`` rows (those
    already held counted as not new). Raises ``ActivityWatchError`` for a body that is no
    export."""
    from ..activitywatch import (
        ActivityWatchError,
        bucket_rows,
        buckets_from_json,
        participant_working_apps,
    )

    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ActivityWatchError("the upload is not JSON: send the file ActivityWatch "
                                 "exported (aw-bucket-export.json or the export of all "
                                 "buckets)") from None
    db = ctx.database()
    buckets = buckets_from_json(data, source)
    rows, reports = bucket_rows(db, pid, buckets, participant_working_apps(db, pid),
                                keep_titles=keep_titles)
    return ActivityResult(rows, [{"type": r.type, "read": r.read, "produced": r.produced,
                                  "new": r.new} for r in reports])


# -- Continue ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ContinueResult:
    """A refusal (``status``, ``code``, ``message``), an ignored event (``ignored``) or a row
    to store (with the decision's kind)."""

    status: int = 200
    code: str = ""
    message: str = ""
    ignored: str | None = None
    row: dict[str, Any] | None = None
    kind: str = ""


def continue_job(ctx: JobContext, pid: str, body: bytes, lookback_s: float) -> ContinueResult:
    """``POST /flowtrial/v1/continue``: parse, check, map and link one Continue event."""
    from ..continue_data import ingest_continue_event
    from ..request_body import unstorable_value

    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return ContinueResult(400, "invalid_json", f"the request body is not valid JSON: {exc}")
    except RecursionError:
        return ContinueResult(400, "invalid_json",
                              "the request body is JSON nested too deeply to read")
    bad = unstorable_value(obj)
    if bad is not None:
        where, what = bad
        uni = "Unicode" in what
        return ContinueResult(400 if uni else 422, "invalid_unicode" if uni
                              else "invalid_number", f"{where}: {what}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ContinueResult(422, "invalid_events",
                              "expected Continue's data body {\"name\", \"data\", \"schema\", …}")
    row, dec = ingest_continue_event(ctx.database(), pid, obj, lookback_s=lookback_s)
    if row is None or dec is None:
        return ContinueResult(ignored=obj["name"][:ctx.caps.max_value_bytes])
    row = _capped_rows([row], ctx.caps)[0]
    return ContinueResult(row=row, kind=dec.kind)

