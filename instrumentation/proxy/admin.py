"""Read-only admin endpoints for the researcher while a study runs.

``GET /flowtrial/v1/admin/status``: cycles per arm and status, manipulation violations per
arm, participants seen, the study's enrollment and SRM check (:mod:`flowtrial.study.status`), the
proxy's own counters (writer queue, record failures) and the database gate's state.
``GET /flowtrial/v1/admin/participants``: per participant its id, arm(s), cycles and when it
was last seen — never keys, key ids or hashes.

Auth: ``Authorization: Bearer <token>``, the token being the value of the environment
variable named by ``proxy.admin_token_env`` (default ``FLOWTRIAL_ADMIN_TOKEN``), read at each
request and compared in constant time. With the variable unset (or shorter than
:data:`MIN_TOKEN_CHARS`) the endpoints are disabled: 403 ``admin_disabled`` saying how to
enable them. No token: 401. Any other token — a participant key included — 403. Errors use
the OpenAI shape, like the rest of ``/flowtrial/v1``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import os
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.status import study_status
from flowtrial.study.storage import Database

__all__ = ["ADMIN_PREFIX", "MIN_TOKEN_CHARS", "admin_routes", "check_admin"]

ADMIN_PREFIX = "/flowtrial/v1/admin"
MIN_TOKEN_CHARS = 16
_HEADERS = {"Cache-Control": "no-store"}


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats (a chi² of an empty study) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None
          ) -> Response:
    return Response(json.dumps(_clean(body), allow_nan=False), status,
                    headers={**_HEADERS, **(headers or {})}, media_type="application/json")


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None
           ) -> Response:
    return _json(status, {"error": {"message": message, "type": "invalid_request_error",
                                    "param": None, "code": code}}, headers)


def check_admin(request: Request, env_name: str) -> Response | None:
    """None if the request carries the admin token, else the response refusing it."""
    token = os.environ.get(env_name, "")
    if len(token) < MIN_TOKEN_CHARS:
        why = "is not set" if not token else f"is shorter than {MIN_TOKEN_CHARS} characters"
        return _error(403, f"admin endpoints are disabled: the environment variable {env_name} "
                           f"(proxy.admin_token_env) {why}; set it to a long random token "
                           "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
                           " before starting the proxy and send it as Authorization: Bearer",
                      "admin_disabled")
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        return _error(401, f"admin token required: send Authorization: Bearer <the value of "
                           f"{env_name}>", "missing_admin_token",
                      {"WWW-Authenticate": 'Bearer realm="flowtrial-admin"'})
    # Bytes: compare_digest refuses non-ASCII str, and a header may carry any latin-1.
    if not hmac.compare_digest(value.encode("utf-8"), token.encode("utf-8")):
        return _error(403, f"that is not the admin token (participant keys are not admin "
                           f"tokens): send Authorization: Bearer <the value of {env_name}>",
                      "invalid_admin_token")
    return None


_WALL = "wall_anchor_ns - mono_anchor_ns + t_request_ns"
_VIOLATIONS = text("SELECT arm, COUNT(*) FROM cycles WHERE violation GROUP BY arm")
_SEEN = text("SELECT COUNT(DISTINCT participant_id) FROM cycles")
_PARTICIPANTS = text("SELECT id, simulated, enrolled_index FROM participants "
                     "ORDER BY enrolled_index, id")
_ASSIGNMENTS = text("SELECT participant_id, period, arm FROM assignments "
                    "ORDER BY participant_id, period")
_CYCLES = text(f"SELECT participant_id, COUNT(*), MAX({_WALL}) FROM cycles "
               "GROUP BY participant_id")
_EVENTS = text("SELECT participant_id, MAX(ts_ns) FROM events GROUP BY participant_id")


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(int(ns) / 1e9, UTC).isoformat().replace("+00:00", "Z")


def status_report(database: Database) -> dict[str, Any]:
    """What ``/admin/status`` shows from the database (synchronous: run it off the loop)."""
    st = study_status(database).to_dict()
    with database.engine.connect() as conn:
        violations = {str(a): int(n) for a, n in conn.execute(_VIOLATIONS)}
        seen = int(conn.execute(_SEEN).scalar_one())
    cycles: dict[str, dict[str, int]] = st["cycles"]  # type: ignore[assignment]
    return {
        "study": {k: st[k] for k in ("name", "design", "unit", "time_scale")},
        "participants_enrolled": st["participants"],
        "participants_seen": seen,
        "assignments": st["assignments"],
        "cycles": cycles,
        "cycles_total": sum(sum(v.values()) for v in cycles.values()),
        "violations": {arm: violations.get(arm, 0) for arm in {*cycles, *violations}},
        "events": st["events"],
        "tasks": st["tasks"],
        "srm": st["srm"],
    }


def participants_report(database: Database) -> list[dict[str, Any]]:
    """What ``/admin/participants`` shows (no key material; run it off the loop)."""
    with database.engine.connect() as conn:
        people = conn.execute(_PARTICIPANTS).all()
        arms: dict[str, list[str]] = {}
        for pid, _, arm in conn.execute(_ASSIGNMENTS):
            arms.setdefault(pid, []).append(arm)
        cycles = {pid: (int(n), last) for pid, n, last in conn.execute(_CYCLES)}
        events = {pid: last for pid, last in conn.execute(_EVENTS)}
    out = []
    for pid, simulated, _ in people:
        n, last_cycle = cycles.get(pid, (0, None))
        seen = [t for t in (last_cycle, events.get(pid)) if t is not None]
        mine = arms.get(pid, [])
        out.append({
            "id": pid,
            "arm": mine[0] if mine else None,
            "arms": mine,
            "simulated": bool(simulated),
            "cycles": n,
            "last_cycle_at": _iso(last_cycle),
            "last_seen_at": _iso(max(seen)) if seen else None,
        })
    return out


def admin_routes(database: Database, config: StudyConfig,
                 prefix: str = ADMIN_PREFIX) -> list[BaseRoute]:
    """The admin routes (mount them in the proxy app; its state adds the live counters)."""
    env_name = config.proxy.admin_token_env

    async def status(request: Request) -> Response:
        denied = check_admin(request, env_name)
        if denied is not None:
            return denied
        body = await asyncio.to_thread(status_report, database)
        st = getattr(request.app.state, "proxy", None)
        body["proxy"] = st.snapshot() if st is not None else None
        # Writer health: the database gate (refusing requests while writes fail), if any.
        gate = getattr(getattr(st, "recorder", None), "gate", None)
        body["database"] = gate.snapshot() if gate is not None else None
        return _json(200, body)

    async def participants(request: Request) -> Response:
        denied = check_admin(request, env_name)
        if denied is not None:
            return denied
        people = await asyncio.to_thread(participants_report, database)
        return _json(200, {"participants": people})

    return [
        Route(f"{prefix}/status", status, methods=["GET"], name="admin_status"),
        Route(f"{prefix}/participants", participants, methods=["GET"],
              name="admin_participants"),
    ]
