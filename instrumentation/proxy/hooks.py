"""Per-request concerns as composable parts (mitmproxy's addons and hooks are the model).

Every HTTP way into the proxy — the model protocols, token counts, the model list, the event
API, activity uploads, and any new route — is built with :func:`guarded` (or
:func:`guarded_route`), which runs one list of hooks, :data:`HOOKS`, around the route's
handler; the Responses WebSocket's handshake runs the same list (:mod:`.websocket`).
Each concern lives in one hook:

- :class:`Counting` — ``requests`` on the way in, ``errors`` for every answer ≥ 400;
- :class:`Recording` — refuse (503 + Retry-After) while the database gate is tripped, and trip
  it when a database read fails mid-request: a request that cannot be recorded is not served;
- :class:`Authentication` — the participant's key (or ``/p/<key>/``), pass-through identity,
  consent and withdrawal: 401 / 403;
- :class:`BodyLimit` — the body read against ``proxy.max_body_bytes``: 413, never held whole;
- :class:`ErrorMapping` — an exception to the protocol's error shape: an upstream's 502/504,
  ingest's 429/503 + Retry-After, a :class:`Refusal` with its own status, a client gone
  mid-body, a bug (500, logged).

A hook has three typed methods, all optional (:class:`RequestHook` has no-op defaults):
``admit`` runs in list order before the handler (the first answer it returns is the reply),
``failed`` turns the handler's (or a hook's) exception into an answer (first non-None wins),
``answered`` sees every reply, in reverse order. The error shape is chosen once per request
(:attr:`Call.adapter`): the route's protocol, else :func:`~.protocols.shape_for` its path.

A new route gets all of it by construction::

    async def handler(call: Call) -> Response:      # call.participant, call.body are set
        return json_response(200, {"got": len(call.body)})

    Route("/flowtrial/v1/thing", guarded(handler), methods=["POST"])
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import OperationalError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..request_body import BodyTooLarge, read_body
from .auth import PATH_KEY, ParticipantInfo, separate_identity
from .protocols import ProtocolAdapter, shape_for
from .protocols.gemini import GEMINI
from .refusal import Refusal
from .responses import error, refused, too_large, unauthorized, unavailable
from .state import ProxyState
from .upstream import UpstreamError

__all__ = ["HOOKS", "Authentication", "BodyLimit", "Call", "Counting", "ErrorMapping",
           "Handler", "Needs", "Recording", "Refusal", "RequestHook", "count_error",
           "count_request", "guarded", "guarded_route", "run_hooks"]

log = logging.getLogger("flowtrial.proxy")


@dataclass(frozen=True)
class Needs:
    """What a route asks of the hooks (all on by default: a new route gets every check)."""

    auth: bool = True  # a participant's key (401), consent and withdrawal (403)
    body: bool = True  # read the body under proxy.max_body_bytes (413), for POST/PUT/PATCH
    own_credential: bool = False  # forwards the caller's provider key under pass-through


@dataclass
class Call:
    """One request on its way through the hooks and its handler."""

    request: Request
    state: ProxyState
    adapter: ProtocolAdapter | None  # the error shape (None: OpenAI's)
    needs: Needs
    headers: Any = None  # the request's headers (a Gemini ?key= moved into a header)
    path_key: str | None = None  # the /p/<key>/ path key, if any
    participant: ParticipantInfo | None = None
    body: bytes = b""

    def error(self, status: int, message: str, type_: str = "invalid_request_error",
              code: str | None = None, param: str | None = None,
              headers: dict[str, str] | None = None) -> Response:
        """An answer in this request's protocol error shape."""
        return error(status, message, type_, code, param, self.adapter, headers)


class RequestHook:
    """A per-request concern; every method is optional (these defaults do nothing)."""

    name = "hook"

    async def admit(self, call: Call) -> Response | None:
        """Before the handler, in list order: an answer here is the reply."""
        return None

    def failed(self, call: Call, exc: Exception) -> Response | None:
        """The handler (or a hook) raised ``exc``: the answer, or None for the next hook."""
        return None

    def answered(self, call: Call, response: Any) -> None:
        """Every reply (a Response, or a model exchange that answers itself)."""
        return None


def count_request(state: ProxyState) -> None:
    """One request in (the health endpoint's ``requests``)."""
    state.requests += 1  # the one place


def count_error(state: ProxyState) -> None:
    """One failed answer (the health endpoint's ``errors``). :class:`Counting` calls it for
    every reply ≥ 400 it sees; what answers after the hooks have run calls it directly: a
    model exchange that answers itself (a stream that fails or cannot be recorded), a
    WebSocket's handshake and turns (no HTTP reply), an OTLP post (its own status shape)."""
    state.errors += 1  # the one place (Counting and what answers after the hooks call it)


class Counting(RequestHook):
    """``requests`` and ``errors`` (the health endpoint's counters), through
    :func:`count_request` and :func:`count_error`: the only places they are written."""

    name = "counting"

    async def admit(self, call: Call) -> Response | None:
        count_request(call.state)
        return None

    def answered(self, call: Call, response: Any) -> None:
        if isinstance(response, Response) and response.status_code >= 400:
            count_error(call.state)


class Recording(RequestHook):
    """No request is served that could not be recorded: 503 + Retry-After while the
    database gate is tripped (:mod:`.health`); a failed database read trips it."""

    name = "recording"

    async def admit(self, call: Call) -> Response | None:
        return None if call.state.recorder.gate.ok else unavailable(call.state, call.adapter)

    def failed(self, call: Call, exc: Exception) -> Response | None:
        if not isinstance(exc, OperationalError):
            return None
        call.state.recorder.gate.trip(exc)
        return unavailable(call.state, call.adapter)


class Authentication(RequestHook):
    """The participant: their flowtrial key (cached after the first check), pass-through
    identity apart from the forwarded credential, consent and withdrawal."""

    name = "authentication"

    async def admit(self, call: Call) -> Response | None:
        request, st = call.request, call.state
        headers: Any = request.headers
        if (call.adapter is not None and call.adapter.family is GEMINI
                and "x-goog-api-key" not in headers and (key := request.query_params.get("key"))):
            headers = {**headers, "x-goog-api-key": key}  # one place to find and redact it
        call.headers, call.path_key = headers, request.scope.get(PATH_KEY)
        if not call.needs.auth:
            return None
        participant = st.auth.cached(headers, call.path_key) or await st.auth.authenticate(
            headers, call.path_key)
        if participant is None:
            return unauthorized(call.adapter)
        if call.needs.own_credential and call.adapter is not None:
            up = st.upstreams.for_family(call.adapter.family.name)
            if up is not None and up.credentials == "participant" and not separate_identity(
                    headers, call.path_key):
                return call.error(401, "this study forwards your own provider credential: "
                                       "send your flowtrial key in the x-flowtrial-key header "
                                       "or use the base URL with /p/<your flowtrial key>",
                                  code="invalid_api_key")
        if (standing := st.auth.refusal(participant.id)) is not None:
            return refused(standing, call.adapter)
        call.participant = participant
        return None


class BodyLimit(RequestHook):
    """The body, read under ``proxy.max_body_bytes`` (413 as soon as it is exceeded)."""

    name = "body_limit"

    async def admit(self, call: Call) -> Response | None:
        if call.needs.body and call.request.method in ("POST", "PUT", "PATCH"):
            call.body = await read_body(call.request, call.state.max_body_bytes)
        return None


class ErrorMapping(RequestHook):
    """Exceptions to answers in the protocol's shape; the last hook, so it also answers a
    bug (500, logged) rather than letting a traceback reach the client."""

    name = "error_mapping"

    def failed(self, call: Call, exc: Exception) -> Response | None:
        if isinstance(exc, BodyTooLarge):
            return too_large(call.state.max_body_bytes, call.adapter)
        if isinstance(exc, UpstreamError):
            return call.error(exc.status, exc.message, "upstream_error", exc.code())
        if isinstance(exc, Refusal):
            return call.error(exc.status, exc.message, exc.type_, exc.code, exc.param,
                              exc.headers() or None)
        if isinstance(exc, ClientDisconnect):  # gone mid-body (or cut off: front_door)
            log.debug("client left mid-request on %s", call.request.url.path)
            return call.error(400, "the request ended before its body was complete",
                              code="incomplete_body")
        log.error("request to %s failed", call.request.url.path, exc_info=exc)
        return call.error(500, "flowtrial proxy error: see the proxy's log", "server_error",
                          "proxy_error")


#: The one list every guarded route runs, in order (mitmproxy's ``default_addons()``).
HOOKS: tuple[RequestHook, ...] = (Counting(), Recording(), Authentication(), BodyLimit(),
                                  ErrorMapping())

Handler = Callable[[Call], Awaitable[Any]]


async def run_hooks(hooks: Sequence[RequestHook], call: Call, handler: Handler) -> Any:
    """``admit`` in order, the handler, ``failed`` on an exception, ``answered`` in reverse."""
    response: Any = None
    try:
        for hook in hooks:
            if (response := await hook.admit(call)) is not None:
                break
        else:
            response = await handler(call)
    except Exception as exc:  # noqa: BLE001 - every exception becomes an answer (or re-raised)
        for hook in hooks:
            if (response := hook.failed(call, exc)) is not None:
                break
        else:
            raise
    for hook in reversed(hooks):
        hook.answered(call, response)
    return response


def guarded(handler: Handler, adapter: type[ProtocolAdapter] | None = None,
            needs: Needs = Needs(), hooks: Sequence[RequestHook] = HOOKS,
            ) -> Callable[[Request], Awaitable[Any]]:
    """A Starlette endpoint running ``hooks`` around ``handler``; errors take ``adapter``'s
    shape (default: the one :func:`~.protocols.shape_for` gives the request's path)."""

    async def endpoint(request: Request) -> Any:
        shape = adapter() if adapter is not None else shape_for(request.url.path)
        call = Call(request, request.app.state.proxy, shape, needs)
        return await run_hooks(hooks, call, handler)

    endpoint.__name__ = getattr(handler, "__name__", "guarded")
    endpoint.hooks = hooks  # type: ignore[attr-defined]  # what it runs (tests, docs)
    return endpoint


def guarded_route(path: str, handler: Handler, methods: Sequence[str] = ("POST",), *,
                  adapter: type[ProtocolAdapter] | None = None,
                  needs: Needs = Needs()) -> Route:
    """A route whose handler runs behind :data:`HOOKS` (the documented way to add one)."""
    return Route(path, guarded(handler, adapter, needs), methods=list(methods))
