"""Decisions from Continue's development data, linked to the proxy's cycles.

Continue (``continuedev/continue``) posts each development-data event to the destinations of
its ``config.yaml`` ``data`` section as ``POST <destination>`` with ``Authorization: Bearer
<apiKey>`` and the body ``{"name", "data", "schema", "level", "profileId"}`` (schemas under
``packages/config-yaml/src/schemas/data/``). Pointing a destination at the proxy's
``POST /flowtrial/v1/continue`` with the participant's own key as ``apiKey`` turns them into
events of that participant (source ``continue``):

===================  ==============================  =========================================
Continue event       condition                       flowtrial event
===================  ==============================  =========================================
autocomplete         ``accepted: true``              ``accept``
autocomplete         ``accepted: false``             ``reject`` (Continue decides this 10 s
                                                     after showing the completion)
nextEditOutcome      ``accepted: true`` / ``false``  ``accept`` / ``reject``
editOutcome          ``accepted: false``             ``reject``
editOutcome          ``accepted: true``              ``accept``; ``partial_accept`` with
                                                     ``accepted_fraction`` when less than 80 %
                                                     of the proposal's fingerprint is in the
                                                     resulting code (level ``all`` only)
chatInteraction,     a finished answer               ``custom`` (``continue_event`` names it),
editInteraction                                      linked like a decision
anything else        —                               ignored (answered 200, nothing written)
===================  ==============================  =========================================

Linking to a cycle: first by id — Continue's ``completionId`` equal to a cycle id or to the
upstream response id the proxy recorded for that participant; else by time and text — the
nearest earlier cycle of the participant (within ``lookback_s``, default 30 min) whose
answer fingerprint contains at least half of the payload's completion text
(:func:`flowtrial.instrumentation.fingerprints.similarity`); else the event is kept unlinked.
With ``level: noCode`` Continue sends no code, so only the id link is possible. No code from
the payload is stored: the event keeps the Continue event name, completion id, model, how it
was linked and the similarity. The event time is when the proxy received the post (Continue
posts as the decision happens). A re-sent payload adds nothing (``dedupe_key``) and is answered
``{"accepted": 0, "duplicates": 1, …}`` (a new one ``{"accepted": 1, "duplicates": 0, …}``).
A body over ``proxy.max_body_bytes`` is refused with 413 as soon as its ``Content-Length``
says so, or as soon as that many bytes have arrived (chunked), without reading the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.participants import participant_by_key
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database, RecordWriter, WriteBatch, utcnow

from .fingerprints import fingerprint, similarity
from .request_body import BodyTooLarge, read_body

__all__ = [
    "CONTINUE_PATH", "ContinueDecision", "KeyAuthenticator", "continue_route", "continue_routes",
    "ingest_continue_event", "link_cycle", "map_continue_event",
]

CONTINUE_PATH = "/flowtrial/v1/continue"
SOURCE = "continue"
NS = 1_000_000_000
LINK_THRESHOLD = 0.5
PARTIAL_BELOW = 0.8
DEFAULT_LOOKBACK_S = 1800.0

Authenticate = Callable[[Mapping[str, str]], Awaitable[Any]]


@dataclass
class ContinueDecision:
    """What one Continue payload becomes (before linking)."""

    kind: str
    continue_event: str
    completion_id: str | None = None
    completion_text: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    dedupe: str = ""


def _strip_fences(code: str) -> str:
    # Chat/edit answers wrap code in markdown fences; they are not part of the code.
    return "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("```"))


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def map_continue_event(body: Mapping[str, Any]) -> ContinueDecision | None:
    """The flowtrial event for a Continue data post (None: not a decision we record)."""
    name = body.get("name")
    data = body.get("data")
    if not isinstance(name, str) or not isinstance(data, Mapping):
        return None
    accepted = data.get("accepted")
    completion = _str(data.get("completion"))
    cid = _str(data.get("completionId"))
    payload: dict[str, Any] = {"continue_event": name}
    model = _str(data.get("modelName")) or _str(data.get("modelTitle"))
    if model:
        payload["model"] = model
    if cid:
        payload["completion_id"] = cid
    if completion is not None:
        payload["completion_chars"] = len(completion)
    if name in ("autocomplete", "nextEditOutcome"):
        if not isinstance(accepted, bool):
            return None  # shown, not decided yet
        kind = "accept" if accepted else "reject"
        if name == "autocomplete":
            if isinstance(data.get("cacheHit"), bool):
                payload["cache_hit"] = data["cacheHit"]
            if not accepted:
                payload["rejected_after_timeout"] = True
    elif name == "editOutcome":
        if not isinstance(accepted, bool):
            return None
        kind = "accept" if accepted else "reject"
        if isinstance(data.get("lineChange"), int | float):
            payload["line_change"] = data["lineChange"]
        new_code = _str(data.get("newCode"))
        if accepted and completion and new_code:
            proposed = fingerprint(_strip_fences(completion))
            if proposed:
                frac = similarity(proposed, fingerprint(new_code))
                if frac < PARTIAL_BELOW:
                    kind = "partial_accept"
                    payload["accepted_fraction"] = round(frac, 4)
    elif name in ("chatInteraction", "editInteraction"):
        kind = "custom"
    else:
        return None
    if cid:
        dedupe = f"continue:{name}:{cid}:{kind}"
    else:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode())
        dedupe = f"continue:{name}:{digest.hexdigest()[:32]}"
    return ContinueDecision(kind, name, cid, completion, payload, dedupe)


_BY_ID = text(
    "SELECT id FROM cycles WHERE participant_id = :pid AND (id = :cid OR "
    "upstream_response_id = :cid) ORDER BY t_request_ns DESC LIMIT 1"
)
_RECENT = text(
    "SELECT id, content_fingerprint, content_text FROM cycles WHERE participant_id = :pid "
    "AND wall_anchor_ns - mono_anchor_ns + t_request_ns BETWEEN :lo AND :hi "
    "ORDER BY wall_anchor_ns - mono_anchor_ns + t_request_ns DESC LIMIT 500"
)


def link_cycle(
    database: Database,
    participant_id: str,
    completion_id: str | None,
    completion_text: str | None,
    ts_ns: int,
    *,
    lookback_s: float = DEFAULT_LOOKBACK_S,
    threshold: float = LINK_THRESHOLD,
) -> tuple[str | None, str, float | None]:
    """(cycle id, how — ``completion_id`` | ``text`` | ``none``, similarity) for a decision."""
    with database.engine.connect() as conn:
        if completion_id:
            row = conn.execute(_BY_ID, {"pid": participant_id, "cid": completion_id}).first()
            if row:
                return row[0], "completion_id", None
        if not completion_text:
            return None, "none", None
        want = fingerprint(_strip_fences(completion_text))
        if not want:
            return None, "none", None
        scale = database.time_scale() or 1.0
        lo = ts_ns - round(lookback_s / scale * NS)
        # A little slack after ts: the two clocks are the same machine's, but the post may
        # be stamped before the recorder's row time by a few ms.
        rows = conn.execute(_RECENT, {"pid": participant_id, "lo": lo, "hi": ts_ns + NS}).all()
    for cid, fp_json, content in rows:
        have: list[int] = []
        if fp_json:
            try:
                have = [int(v) for v in json.loads(fp_json)]
            except (ValueError, TypeError):
                have = []
        elif content:
            have = fingerprint(content)
        if have:
            score = similarity(want, have)
            if score >= threshold:
                return cid, "text", round(score, 4)
    return None, "none", None


def ingest_continue_event(
    database: Database,
    participant_id: str,
    body: Mapping[str, Any],
    *,
    ts_ns: int | None = None,
    lookback_s: float = DEFAULT_LOOKBACK_S,
) -> tuple[dict[str, Any] | None, ContinueDecision | None]:
    """The events row for one Continue post (None if it is not recorded) and its mapping.

    Synchronous (database reads); the caller writes the row.
    """
    dec = map_continue_event(body)
    if dec is None:
        return None, None
    ts = time.time_ns() if ts_ns is None else ts_ns
    cycle_id, how, score = link_cycle(database, participant_id, dec.completion_id,
                                      dec.completion_text, ts, lookback_s=lookback_s)
    payload = dict(dec.payload, link=how)
    if score is not None:
        payload["similarity"] = score
    row = {
        "participant_id": participant_id, "cycle_id": cycle_id, "kind": dec.kind,
        "ts_ns": ts, "duration_s": None, "source": SOURCE,
        "payload_json": json.dumps(payload, ensure_ascii=False),
        "dedupe_key": f"{dec.dedupe}:{participant_id}", "received_at": utcnow(),
    }
    return row, dec


class KeyAuthenticator:
    """Participant lookup by the ``Authorization: Bearer`` key, cached per process (used when
    the routes are not given the proxy's own authenticator)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._cache: dict[str, Any] = {}

    async def authenticate(self, headers: Mapping[str, str]) -> Any:
        auth = headers.get("authorization") or ""
        scheme, _, key = auth.partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""
        key = key or (headers.get("x-api-key") or "").strip()
        if not key:
            return None
        if key in self._cache:
            return self._cache[key]
        p = await asyncio.to_thread(participant_by_key, self.database, key)
        if p is not None:
            self._cache[key] = p
        return p


_STORED_TS = text("SELECT ts_ns FROM events WHERE dedupe_key = :k")


def _is_new(database: Database, row: dict[str, Any]) -> bool:
    """Whether the stored row for ``row``'s dedupe key is this one (it was new), not an
    earlier post's (a re-send). Race-free: of concurrent identical posts exactly one row
    wins, and only its post finds its own receive time."""
    with database.engine.connect() as conn:
        stored = conn.execute(_STORED_TS, {"k": row["dedupe_key"]}).scalar()
    return stored == row["ts_ns"]


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": code}}, status)


async def _accept(ingest: Any, database: Database, pid: str, body: bytes,
                  lookback_s: float) -> JSONResponse:
    """One post's event: parsed and linked by ingest, stored; the answer. Ingest's refusals
    (:class:`~.proxy.ingest.IngestBusy`) are raised for the caller to answer."""
    from .proxy.ingest import IngestBusy
    from .proxy.ingest_jobs import continue_job

    try:
        res = await ingest.run(pid, continue_job, ingest.context, pid, body, lookback_s)
        if res.row is not None:
            row = res.row
            await ingest.store(pid, WriteBatch(Event, [row], ignore_conflicts=True), database)
    except IngestBusy:
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the client, nothing claimed
        return _error(503, f"the event could not be recorded ({type(exc).__name__})",
                      "recording_failed")
    if res.status != 200:
        return _error(res.status, res.message, res.code)
    if res.row is None:
        return JSONResponse({"accepted": 0, "ignored": res.ignored})
    # The insert ignores a re-sent payload's conflict; tell the client which it was.
    new = await asyncio.to_thread(_is_new, database, row)
    return JSONResponse({"accepted": int(new), "duplicates": int(not new),
                         "kind": res.kind, "cycle_id": row["cycle_id"],
                         "link": json.loads(row["payload_json"])["link"]})


def continue_route(database: Database, lookback_s: float = DEFAULT_LOOKBACK_S) -> BaseRoute:
    """``POST /flowtrial/v1/continue`` inside the proxy app: behind the proxy's hooks
    (:mod:`.proxy.hooks`: key, consent, body limit, counting, recording, error shape), with
    its ingest processes and writer."""
    from .proxy.hooks import Call, guarded_route
    from .proxy.ingest import ingest_of

    async def flowtrial_continue(call: Call) -> JSONResponse:
        assert call.participant is not None
        return await _accept(ingest_of(call.state), database, call.participant.id, call.body,
                             lookback_s)

    return guarded_route(CONTINUE_PATH, flowtrial_continue)


def continue_routes(
    database: Database,
    config: StudyConfig,
    authenticate: Authenticate | None = None,
    *,
    writer: RecordWriter | None = None,
    lookback_s: float = DEFAULT_LOOKBACK_S,
) -> list[BaseRoute]:
    """``POST /flowtrial/v1/continue`` on its own (participant key as ``Authorization:
    Bearer``); the proxy app serves :func:`continue_route` instead.

    ``authenticate(headers)`` returns the participant (anything with ``.id``) or None; by
    default keys are checked here. Rows go to ``writer``, else straight to the database.
    """
    from .proxy.ingest import Ingest, IngestBusy

    own = KeyAuthenticator(database)
    limit = config.proxy.max_body_bytes
    ingest = Ingest(database.url, writer, config.proxy, processes=False)

    async def endpoint(request: Request) -> JSONResponse:
        participant = await (authenticate or own.authenticate)(request.headers)
        if participant is None:
            return _error(401, "missing or unknown flowtrial participant key: set the data "
                               "destination's apiKey to your own key (ft_…)", "invalid_api_key")
        try:
            body = await read_body(request, limit)
            return await _accept(ingest, database, participant.id, body, lookback_s)
        except BodyTooLarge:
            return _error(413, f"request body larger than the proxy's limit of {limit} bytes "
                               "(proxy.max_body_bytes)", "request_too_large")
        except IngestBusy as exc:
            resp = _error(exc.status, exc.message, exc.code or "ingest_busy")
            resp.headers.update(exc.headers())
            return resp

    return [Route(CONTINUE_PATH, endpoint, methods=["POST"], name="flowtrial_continue")]
