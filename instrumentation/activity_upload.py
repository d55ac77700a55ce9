"""Activity upload (docs/researchers/field-study.md): a participant's ActivityWatch data
reaches the study through the proxy, authenticated by their key.

``GET /flowtrial/v1/capture-policy``: what their machine may send
(:func:`~flowtrial.instrumentation.aw_sync.capture_policy`; ``flowtrial sync-activitywatch``
filters by it before sending). ``POST /flowtrial/v1/activitywatch``: an export
(``{"buckets": …}``: aw-server's ``/api/0/export``, the Research Edition's
``aw-bucket-export.json``, or the sync command's filtered one), idempotent (events are keyed
by bucket and start). ``GET /flowtrial/v1/activitywatch``: what the study holds of them.
The participant page's upload form uses the same :func:`ingest_export`.

Parsing and writing never run on the event loop: :func:`ingest_export` (parse + convert +
write, one function, so it can move onto a shared ingest path) runs in a worker thread behind
an :class:`UploadGate` (one running, a few waiting); beyond that the answer is 429 with
``Retry-After``, and 503 while the database gate is tripped.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database

from .activitywatch import (
    SOURCE,
    ActivityWatchError,
    buckets_from_json,
    participant_working_apps,
    write_buckets,
)
from .aw_sync import POLICY_PATH, UPLOAD_PATH, capture_policy
from .proxy.responses import error, json_response, proxy_state, refused, too_large, unauthorized
from .proxy.responses import unavailable as db_unavailable
from .request_body import BodyTooLarge, read_body

__all__ = ["UploadGate", "activity_paths", "activity_routes", "activity_summary",
           "ingest_export"]

RETRY_AFTER_S = 5
_E = Event.__table__  # type: ignore[attr-defined]


class UploadGate:
    """At most ``running`` uploads parse at once and ``waiting`` more queue; the rest are
    told to come back (429 + Retry-After)."""

    def __init__(self, running: int = 1, waiting: int = 4) -> None:
        self._sem = asyncio.Semaphore(running)
        self._limit = running + waiting
        self._inside = 0
        self.turned_away = 0

    def full(self) -> bool:
        return self._inside >= self._limit

    async def run(self, fn: Any, *args: Any) -> Any:
        self._inside += 1
        try:
            async with self._sem:
                return await asyncio.to_thread(fn, *args)
        finally:
            self._inside -= 1


def busy() -> Response:
    resp = error(429, "flowtrial is busy with other uploads: try again in a few seconds",
                 "rate_limit_error", "upload_busy")
    resp.headers["retry-after"] = str(RETRY_AFTER_S)
    return resp


def _iso(ns: int | None) -> str | None:
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def activity_summary(database: Database, pid: str) -> dict[str, Any]:
    """What the study holds of ``pid``'s activity: events per kind, first and last time."""
    with database.engine.connect() as conn:
        rows = conn.execute(select(_E.c.kind, func.count(), func.min(_E.c.ts_ns),
                                   func.max(_E.c.ts_ns))
                            .where(_E.c.participant_id == pid, _E.c.source == SOURCE)
                            .group_by(_E.c.kind)).all()
    kinds = {r[0]: int(r[1]) for r in rows}
    first = min((r[2] for r in rows), default=None)
    last = max((r[3] for r in rows), default=None)
    return {"events": sum(kinds.values()), "by_kind": kinds, "first": _iso(first),
            "last": _iso(last)}


def ingest_export(database: Database, config: StudyConfig, pid: str, body: bytes,
                  source: str = "upload") -> dict[str, Any]:
    """Parse an uploaded export and write its events (idempotent); the receipt. Blocking:
    run it in a worker thread. Raises ActivityWatchError for a body that is no export."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ActivityWatchError("the upload is not JSON: send the file ActivityWatch "
                                 "exported (aw-bucket-export.json or the export of all "
                                 "buckets)") from None
    buckets = buckets_from_json(data, source)
    report = write_buckets(database, pid, buckets, source,
                           participant_working_apps(database, pid),
                           keep_titles=config.capture.content == "full")
    return {"received": report.produced, "new": report.new,
            "buckets": [{"type": b.type, "read": b.read, "produced": b.produced,
                         "new": b.new} for b in report.buckets],
            "held": activity_summary(database, pid)}


def activity_routes(database: Database, config: StudyConfig,
                    gate: UploadGate | None = None) -> list[BaseRoute]:
    """The capture-policy and activity-upload routes (mounted in the proxy)."""
    uploads = gate or UploadGate()

    async def participant(request: Request) -> Any:
        st = proxy_state(request)
        st.requests += 1
        p = st.auth.cached(request.headers) or await st.auth.authenticate(request.headers)
        if p is None:
            st.errors += 1
            return unauthorized()
        if (standing := st.auth.refusal(p.id)) is not None:
            st.errors += 1
            return refused(standing)
        return p

    async def policy(request: Request) -> Response:
        p = await participant(request)
        if isinstance(p, Response):
            return p
        apps = await asyncio.to_thread(participant_working_apps, database, p.id)
        return json_response(200, capture_policy(config, apps))

    async def upload(request: Request) -> Response:
        p = await participant(request)
        if isinstance(p, Response):
            return p
        st = proxy_state(request)
        if not st.recorder.gate.ok:
            return db_unavailable(st)
        if uploads.full():
            uploads.turned_away += 1
            return busy()
        try:
            body = await read_body(request, st.max_body_bytes)
            receipt = await uploads.run(ingest_export, database, config, p.id, body)
        except BodyTooLarge:
            st.errors += 1
            return too_large(st.max_body_bytes)
        except ActivityWatchError as exc:
            st.errors += 1
            return error(422, str(exc), code="not_an_export")
        return json_response(200, receipt)

    async def held(request: Request) -> Response:
        p = await participant(request)
        if isinstance(p, Response):
            return p
        return json_response(200, {"held": await asyncio.to_thread(
            activity_summary, database, p.id)})

    async def activity(request: Request) -> Response:
        return await (held(request) if request.method == "GET" else upload(request))

    return [Route(POLICY_PATH, policy, methods=["GET"]),
            Route(UPLOAD_PATH, activity, methods=["GET", "POST"])]


def activity_paths() -> dict[str, Any]:
    """The OpenAPI ``paths`` of the capture policy and the activity upload."""
    sec: list[dict[str, list[str]]] = [{"participantKey": []}, {"participantApiKey": []}]
    ok = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {
        POLICY_PATH: {"get": {
            "operationId": "getCapturePolicy", "security": sec,
            "summary": "What the participant's machine may send (filtered there).",
            "responses": {"200": ok, "401": {"description": "Unknown key.", **err}}}},
        UPLOAD_PATH: {
            "post": {"operationId": "postActivityWatch", "security": sec,
                     "summary": "Upload an ActivityWatch export (idempotent).",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"type": "object"}}}},
                     "responses": {
                         "200": ok, "401": {"description": "Unknown key.", **err},
                         "403": {"description": "No consent, or withdrawn.", **err},
                         "413": {"description": "Over proxy.max_body_bytes.", **err},
                         "422": {"description": "Not an ActivityWatch export.", **err},
                         "429": {"description": "Busy: retry after Retry-After.", **err},
                         "503": {"description": "The database is unavailable.", **err}}},
            "get": {"operationId": "getActivityWatch", "security": sec,
                    "summary": "What the study holds of the participant's activity.",
                    "responses": {"200": ok, "401": {"description": "Unknown key.", **err}}},
        },
    }
