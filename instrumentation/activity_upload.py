"""Activity upload (docs/researchers/field-study.md): a participant's ActivityWatch data
reaches the study through the proxy, authenticated by their key.

``GET /flowtrial/v1/capture-policy``: what their machine may send
(:func:`~flowtrial.instrumentation.aw_sync.capture_policy`; ``flowtrial sync-activitywatch``
filters by it before sending). ``POST /flowtrial/v1/activitywatch``: an export
(``{"buckets": …}``: aw-server's ``/api/0/export``, the Research Edition's
``aw-bucket-export.json``, or the sync command's filtered one), idempotent (events are keyed
by bucket and start). ``GET /flowtrial/v1/activitywatch``: what the study holds of them.
The participant page's upload form uses the same :func:`ingest_upload`.

Parsing never runs on the event loop, nor in its process: an export goes through the proxy's
ingest path (:mod:`flowtrial.instrumentation.proxy.ingest`: the job
:func:`~flowtrial.instrumentation.proxy.ingest_jobs.activity_job` parses and maps it in an
ingest process, bounded admission answers 503/429 with ``Retry-After`` when full, the rows
are stored behind the token path's records and count against the daily quota), and 503
while the database gate is tripped.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from starlette.responses import Response
from starlette.routing import BaseRoute

from flowtrial.study.config import StudyConfig
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database, WriteBatch

from .activitywatch import SOURCE, ActivityWatchError, participant_working_apps
from .aw_sync import POLICY_PATH, UPLOAD_PATH, capture_policy
from .proxy.hooks import Call, guarded_route
from .proxy.ingest import ingest_of
from .proxy.ingest_jobs import activity_job
from .proxy.responses import json_response

__all__ = ["activity_paths", "activity_routes", "activity_summary", "ingest_upload"]

_E = Event.__table__  # type: ignore[attr-defined]


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


async def ingest_upload(state: Any, database: Database, config: StudyConfig, pid: str,
                        body: bytes, source: str = "upload") -> dict[str, Any]:
    """Parse, map and store an uploaded export through the proxy's ingest path (idempotent);
    the receipt. Raises ActivityWatchError for a body that is no export and
    :class:`~flowtrial.instrumentation.proxy.ingest.IngestBusy` when ingest is full."""
    ingest = ingest_of(state)
    result = await ingest.run(pid, activity_job, ingest.context, pid, body, source,
                              config.capture.content == "full")
    if result.rows:
        await ingest.store(pid, WriteBatch(Event, result.rows, ignore_conflicts=True),
                           database)
    return {"received": sum(b["produced"] for b in result.buckets),
            "new": sum(b["new"] for b in result.buckets), "buckets": result.buckets,
            "held": await asyncio.to_thread(activity_summary, database, pid)}


def activity_routes(database: Database, config: StudyConfig) -> list[BaseRoute]:
    """The capture-policy and activity-upload routes (mounted in the proxy)."""

    async def policy(call: Call) -> Response:
        assert call.participant is not None
        apps = await asyncio.to_thread(participant_working_apps, database, call.participant.id)
        return json_response(200, capture_policy(config, apps))

    async def activity(call: Call) -> Response:
        """GET: what is held; POST: an upload (the hooks answer 401/403/413/429/503)."""
        assert call.participant is not None
        pid = call.participant.id
        if call.request.method == "GET":
            return json_response(200, {"held": await asyncio.to_thread(
                activity_summary, database, pid)})
        try:
            receipt = await ingest_upload(call.state, database, config, pid, call.body)
        except ActivityWatchError as exc:
            return call.error(422, str(exc), code="not_an_export")
        return json_response(200, receipt)

    return [guarded_route(POLICY_PATH, policy, ["GET"]),
            guarded_route(UPLOAD_PATH, activity, ["GET", "POST"])]


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
