"""``flowtrial import-otel``: agents' telemetry from OTLP JSON files, with the receiver's
mapping and linking.

A file holds OTLP/JSON export requests: one per line (the OpenTelemetry Collector's ``file``
exporter), or one JSON document. Each names its signal by its top-level key
(``resourceLogs``, ``resourceSpans``, ``resourceMetrics``). Gemini CLI's own
``telemetry.outfile`` (the JS SDK's records, pretty-printed one after another) is detected
and read too (:mod:`.sdk_json`). The whole file is read and
checked before anything is written; rows are keyed by record digest, so importing a file
twice — or a file whose records also arrived live at the proxy — adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, text

from flowtrial.study.errors import FlowtrialError
from flowtrial.study.schema import Event, Participant
from flowtrial.study.storage import Database, WriteBatch, utcnow, write_rows
from flowtrial.study.validation import check_time_ns, decode_json

from .ingest import HORIZON_S, prepare_rows, relink
from .otlp import OtelRecord, OtlpDecodeError, Signal, parse_json_request, records
from .sdk_json import is_sdk_record, sdk_records
from .team import refresh_turns, strip_identity

__all__ = ["OtelImportError", "OtelImportReport", "import_otel", "read_otlp_json"]

_SIGNAL_KEYS: dict[str, Signal] = {
    "resourceLogs": "logs", "resource_logs": "logs",
    "resourceSpans": "traces", "resource_spans": "traces",
    "resourceMetrics": "metrics", "resource_metrics": "metrics",
}


class OtelImportError(FlowtrialError):
    """A file that cannot be imported (nothing of it was written)."""


@dataclass
class OtelImportReport:
    participant_id: str
    records: int
    by_kind: dict[str, int]
    new: int
    linked: int
    relinked: int


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    """Every JSON value in the file with its first line: one document, one per line, or
    pretty-printed objects one after another (Gemini CLI's outfile)."""
    try:
        content = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise OtelImportError(f"{path}: a folder, not a file: give the OTLP JSON file"
                              ) from None
    except OSError as exc:
        raise OtelImportError(f"{path}: cannot read it ({exc.strerror}): check the path and "
                              "its permissions") from None
    except UnicodeDecodeError as exc:
        raise OtelImportError(f"{path}: not UTF-8 text ({exc.reason}): give the OTLP JSON "
                              "file") from None
    pos, end = 0, len(content)
    while True:
        while pos < end and content[pos].isspace():
            pos += 1
        if pos >= end:
            return
        line = content.count("\n", 0, pos) + 1
        try:
            doc, pos = decode_json(content, f"{path}:{line}", pos)
        except ValueError as exc:
            raise OtelImportError(f"{path}:{line}: not JSON ({exc}): the file must hold OTLP "
                                  "JSON export requests (one per line) or Gemini CLI's "
                                  "telemetry outfile") from None
        yield line, doc


def read_otlp_json(path: str | Path) -> list[OtelRecord]:
    """Every record of an OTLP JSON file, or of Gemini CLI's ``outfile`` (the SDK's records,
    :mod:`.sdk_json`), refusing the whole file on the first bad object."""
    path = Path(path)
    out: list[OtelRecord] = []
    for n, doc in _documents(path):
        signals = [s for k, s in _SIGNAL_KEYS.items() if isinstance(doc, dict) and k in doc]
        if not signals and is_sdk_record(doc):
            out += sdk_records(doc)
            continue
        if len(signals) != 1:
            raise OtelImportError(f"{path}:{n}: neither an OTLP JSON export request (one of "
                                  "resourceLogs, resourceSpans, resourceMetrics) nor a record "
                                  "of Gemini CLI's telemetry outfile")
        try:
            out += records(signals[0], parse_json_request(signals[0], doc))
        except OtlpDecodeError as exc:
            raise OtelImportError(f"{path}:{n}: {exc}") from None
    for rec in out:
        _check_record(rec, str(path))
    return out


def _check_record(rec: OtelRecord, source: str) -> None:
    """Refuse a record whose times the database cannot hold (0 means "no time": now)."""
    what = f"{source}: {rec.signal} record {rec.name[:60]!r}"
    check_time_ns(rec.time_ns, f"{what}: time")
    if rec.end_ns is not None:
        check_time_ns(rec.end_ns, f"{what}: end time")


_EXISTING = text("SELECT dedupe_key FROM events WHERE dedupe_key IN :keys").bindparams(
    bindparam("keys", expanding=True))


def import_otel(database: Database, participant_id: str, path: str | Path
                ) -> OtelImportReport:
    """Import ``path`` for ``participant_id``; see the module docstring."""
    with database.session() as s:
        if s.get(Participant, participant_id) is None:
            raise OtelImportError(f"no participant {participant_id!r} in this study: see "
                                  "`flowtrial status` for the enrolled ids")
    recs = read_otlp_json(path)
    observe = database.config().study.design == "observe"
    if observe:  # a team study: the person is the given pseudonym; identities never stored
        recs = strip_identity(recs)
    full = database.config().capture.content == "full"
    rows = prepare_rows(database, participant_id, recs, full, time.time_ns(), utcnow())
    keys = [r["dedupe_key"] for r in rows]
    existing: set[str] = set()
    with database.engine.connect() as conn:
        for i in range(0, len(keys), 500):
            existing |= {r[0] for r in conn.execute(_EXISTING, {"keys": keys[i:i + 500]})}
    new = [r for r in rows if r["dedupe_key"] not in existing]
    if new:
        write_rows(database, [WriteBatch(Event, new, ignore_conflicts=True)])
    relinked = 0
    if rows:  # the new rows' own late links, now that they are stored
        horizon = round(HORIZON_S * 1e9)
        with database.engine.begin() as conn:
            relinked = relink(conn, participant_id, min(r["ts_ns"] for r in rows) - horizon,
                              max(r["ts_ns"] for r in rows) + horizon)
    if observe and new:
        refresh_turns(database, new)
    by_kind: dict[str, int] = {}
    for r in new:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
    return OtelImportReport(participant_id, len(recs), by_kind, len(new),
                            sum(1 for r in new if r["cycle_id"]), relinked)
