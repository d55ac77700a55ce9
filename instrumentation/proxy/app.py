"""The proxy's ASGI app (Starlette): the model routes, authentication, limits, lifecycle, and
the extensions it is given.

Core routes: one per protocol adapter (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/messages``), the Responses WebSocket mode on ``ws://…/v1/responses``
(:mod:`flowtrial.instrumentation.proxy.websocket`), ``POST /v1/messages/count_tokens``
(authenticated, passed to the Anthropic upstream, not a cycle: no answer to shape), ``GET
/v1/models`` (authenticated, arm-neutral), ``GET /flowtrial/v1/health`` and ``GET``/``HEAD /``
(open; Claude Code probes ``HEAD /``). Everything else comes from extensions
(:mod:`flowtrial.instrumentation.proxy.extensions`: the event API ``POST
/flowtrial/v1/events``, Continue's data destination, the participant page, ``GET
/flowtrial/v1/admin/…``, ``GET /flowtrial/v1/openapi.json``, agents' OpenTelemetry on ``POST
/flowtrial/otlp/v1/logs|traces|metrics``), chosen by the composition root.
Unknown paths get 404 and every error comes back in the protocol's own error shape (OpenAI's
by default, Anthropic's on the Messages paths).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.storage import Database, RecordWriter

from .auth import CREDENTIAL_HEADERS, PATH_KEY
from .extensions import AppContext, ProxyExtension, builtin_extensions
from .health import RETRY_AFTER_S
from .hooks import Call, Needs, guarded, guarded_route
from .openapi import health_paths
from .protocols import (
    FAMILIES,
    PROTOCOLS,
    GeminiAdapter,
    MessagesAdapter,
    ProtocolAdapter,
    match_route,
    shape_for,
)
from .relay import Exchange
from .responses import (
    error,
    foreign_response_message,
    json_response,
    proxy_state,
)
from .routing import UpstreamRouter
from .runtime_tuning import ProxyTuning, give_way
from .state import ProxyState, close_writer, make_writer
from .upstream import (
    CYCLE_HEADER,
    Upstream,
    forwardable_request_headers,
)
from .websocket import serve_responses_socket

__all__ = ["GRACE_S", "ProxyApp", "create_proxy_app"]

log = logging.getLogger("flowtrial.proxy")
GRACE_S = 30.0  # how long shutdown waits for open streams before recording them abandoned
ROUTE_PARAMS = "flowtrial.route_params"  # ASGI scope entry: a templated route's parameters


def _strip_path_key(scope: dict[str, Any]) -> None:
    """``/p/<key>/rest`` → ``/rest``, the key kept in the scope (:data:`PATH_KEY`): the
    participant's identity for clients that can only set a base URL."""
    _, _, rest = scope["path"][3:].partition("/")
    key = scope["path"][3:].split("/", 1)[0]
    if not key:
        return
    scope[PATH_KEY] = key
    scope["path"] = "/" + rest
    scope["raw_path"] = scope["path"].encode()


#: The model routes and token counts forward the caller's provider key under pass-through.
_FORWARDING = Needs(own_credential=True)


def _invalid_json(call: Call, what: str) -> Response:
    return call.error(400, f"the request body {what}", code="invalid_json")


def _compressed(call: Call) -> Response | None:
    """415 for a compressed model request (``Content-Encoding``): the proxy must read a
    request to shape and record it, and reads JSON as sent. Codex compresses with zstd when
    signed in with ChatGPT through a provider it takes for OpenAI's own."""
    encoding = call.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    return call.error(415, f"the proxy reads model requests uncompressed, not with "
                           f"Content-Encoding {encoding!r}: turn the client's request "
                           "compression off (Codex: enable_request_compression = false "
                           "under [features])", code="unsupported_content_encoding")


def _protocol_endpoint(adapter_cls: type[ProtocolAdapter]) -> Any:
    async def handler(call: Call) -> Any:
        """A model request, past the hooks (:mod:`.hooks`): parsed, checked, exchanged."""
        st, request, adapter, participant = call.state, call.request, call.adapter, \
            call.participant
        assert adapter is not None and participant is not None
        params = request.scope.get(ROUTE_PARAMS)
        if params is not None:
            adapter.url_params = {**params, "alt": request.query_params.get("alt", "")}
        if (refused := _compressed(call)) is not None:
            return refused
        body = call.body
        t_request = time.monotonic_ns()
        await give_way()  # reading a large body must not hold up a due first token
        parsed = await st.parser.parse(adapter.name, params and adapter.url_params, body)
        if parsed.view is None:
            return _invalid_json(call, parsed.error or "is not valid JSON")
        info = parsed.view
        if await st.turns.foreign_response(participant.id, info.previous_response_id):
            # another participant's conversation is not to be continued
            return call.error(404, foreign_response_message(info.previous_response_id),
                              code="previous_response_not_found", param="previous_response_id")
        exchange = Exchange(st, adapter, participant, body, info, call.headers, t_request,
                            request.scope.get("query_string", b"").decode("latin-1"),
                            request.url.path, call.path_key)
        joins = st.turns.arrive_view(exchange.rec, info, parsed.input_key, body, call.headers)
        if joins is not None:  # a continuation: its turn may be another process's
            await st.turns.reconcile(exchange.rec, joins)
        return exchange

    handler.__name__ = f"proxy_{adapter_cls.name}"
    return guarded(handler, adapter_cls, _FORWARDING)


async def _models(call: Call) -> Response:
    """The arm-neutral model list, from the upstream (for the mock, its list); Gemini's
    ``GET /v1beta/models`` from the Gemini upstream."""
    path = call.request.url.path
    gemini = path.startswith("/v1beta/")
    families = ("gemini",) if gemini else ("openai", "anthropic")
    upstream = next((u for f in families if (u := call.state.upstreams.for_family(f))), None)
    if upstream is None:
        return call.error(501, "no upstream configured", "upstream_error", "no_upstream")
    reply, body = await _relay_whole(upstream, call.headers, lambda fwd: (
        upstream.request("GET", path, fwd, b"") if gemini else upstream.models(fwd)))
    return Response(body, reply.status, media_type=reply.content_type or "application/json")


async def _relay_whole(upstream: Any, headers: Any, call: Any) -> Any:
    """A non-cycle request passed upstream whole: the participant's credential goes along
    under pass-through; (reply, body). An UpstreamError is the hooks' to answer."""
    forwarded = forwardable_request_headers(headers)
    if upstream.credentials == "participant":
        forwarded.update({h: v for h in CREDENTIAL_HEADERS if (v := headers.get(h))})
    reply = await call(forwarded)
    try:
        body = b"".join([c async for c in reply.body])
    finally:
        await reply.close()
    return reply, body


async def _count_tokens(call: Call) -> Response:
    """A token count (``POST /v1/messages/count_tokens``, Gemini's ``:countTokens``): passed
    to the protocol's upstream as is. Not a cycle: it answers no prompt, so there is nothing
    to shape (docs/internals/protocols.md)."""
    adapter, body, request = call.adapter, call.body, call.request
    assert adapter is not None
    if (refused := _compressed(call)) is not None:
        return refused
    # Forwarded as is, but only a JSON object (the protocol's shape) goes upstream; a large
    # one is checked off the loop (.body_parser).
    if (await call.state.parser.parse(adapter.name, None, body)).view is None:
        return _invalid_json(call, f"must be a JSON object ({adapter.name} token count "
                                   "request)")
    family = adapter.family.name
    upstream = call.state.upstreams.for_family(family)
    if upstream is None:
        return call.error(501, f"this proxy has no upstream for {adapter.name}: add "
                               f"[upstream.{family}] to the study file", "upstream_error",
                          "no_upstream")
    path = adapter.upstream_path(request.url.path, request.url.query)
    reply, out = await _relay_whole(upstream, call.headers,
                                    lambda fwd: upstream.request("POST", path, fwd, body))
    headers_out = {k: v for k, v in reply.headers
                   if k.lower() not in ("content-type", CYCLE_HEADER)}
    return Response(out, reply.status, headers=headers_out,
                    media_type=reply.content_type or "application/json")


async def root(request: Request) -> Response:
    """``GET``/``HEAD /``: a quick 200 (Claude Code checks the base URL answers)."""
    return json_response(200, {"service": "flowtrial-proxy", "status": "ok"})


async def health(request: Request) -> Response:
    """Liveness and load, no authentication (no participant data in it); 503 while the
    database gate is tripped (the proxy is refusing requests); status ``degraded`` (200) once
    a cycle's row failed for a reason not the database's or a held row was given up."""
    st = proxy_state(request)
    gate = st.recorder.gate
    status = ("unavailable" if not gate.ok else "degraded" if gate.degraded else "ok")
    body = {"status": status, **st.snapshot(),
            "database": gate.snapshot(),
            "quiet_gc": st.collector.snapshot() if st.collector is not None else None,
            "front_door": door.snapshot() if (door := getattr(request.app.state, "front_door",
                                                               None)) is not None else None}
    if gate.ok:
        return json_response(200, body)
    return json_response(503, body, {"retry-after": str(RETRY_AFTER_S)})


def _unknown_path(request: Request) -> None:
    """Count and log a request to a path the proxy does not serve (the path only: no body,
    no query, no headers), so an unsupported client is visible to the operator."""
    counts: Counter[str] = request.app.state.unknown_paths
    path = request.url.path[:200]
    if path not in counts and len(counts) >= 1000:
        path = "(other paths)"  # bounded: a scanner must not grow it without end
    counts[path] += 1
    log.warning("unknown path: %s %s (%d request(s) to it so far)", request.method, path,
                counts[path])


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    adapter = shape_for(request.url.path)
    if exc.status_code == 404:
        _unknown_path(request)
        return error(404, f"unknown path {request.url.path}: the proxy serves "
                           "/v1/chat/completions, /v1/completions, /v1/responses (HTTP and "
                           "WebSocket), /v1/messages, /v1beta/models/<model>:generateContent "
                           "and :streamGenerateContent, /v1/models and /flowtrial/v1/events",
                      code="unknown_url", adapter=adapter)
    if exc.status_code == 405:
        resp = error(405, f"method {request.method} not allowed on {request.url.path}",
                      code="method_not_allowed", adapter=adapter)
        resp.headers.update(exc.headers or {})  # Allow: the methods it takes (RFC 9110)
        return resp
    return error(exc.status_code, str(exc.detail), adapter=adapter)


async def _client_disconnect(request: Request, exc: Exception) -> Response:
    return _client_gone(request)


def _client_gone(request: Request) -> Response:
    """The client left (or was cut off by a front-door timeout) before its request was whole:
    a quiet 400 nobody reads, no traceback."""
    log.debug("client left mid-request on %s", request.url.path)
    return error(400, "the request ended before its body was complete", code="incomplete_body")


class ProxyApp(Starlette):
    """Starlette, with the model routes dispatched straight to their endpoints: they handle
    their own errors, and skipping the middleware stack saves its wrappers on the request
    and on every ``send`` of a stream."""

    def __init__(self, *args: Any, fast: dict[type[ProtocolAdapter], Any],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast = fast
        self.state.unknown_paths = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith("/p/"):
            _strip_path_key(scope)
        if scope["type"] == "websocket" and scope["path"] in ("/v1/responses", "/responses"):
            await serve_responses_socket(self.state.proxy, scope, receive, send)
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            route = match_route(scope["path"])
            endpoint = self._fast.get(route[0]) if route is not None else None
            if endpoint is not None:
                assert route is not None
                if route[1]:
                    scope[ROUTE_PARAMS] = route[1]
                scope["app"] = self
                response = await endpoint(Request(scope, receive, send))  # guarded: no raise
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_proxy_app(database: Database, config: StudyConfig, *,
                     writer: RecordWriter | None = None,
                     upstream: Upstream | UpstreamRouter | None = None,
                     grace_s: float = GRACE_S, instance: str | None = None,
                     page_secret: bytes | None = None,
                     extensions: Sequence[ProxyExtension] | None = None) -> Starlette:
    """The proxy app for ``config`` recording into ``database``.

    ``instance`` names this proxy in ``cycles.recorded_by`` (default ``host:pid``).
    ``page_secret`` signs participant-page sessions (the workers of one proxy share it, so a
    login holds whichever worker serves the next request).

    ``writer``: a RecordWriter to share (its owner closes it); by default the app makes its
    own at startup and drains and closes it at shutdown. ``upstream``: an Upstream (serves
    every protocol family) or an UpstreamRouter; by default built from ``[upstream]``.
    ``extensions``: what the app serves besides the model protocols and health
    (:mod:`.extensions`; the composition root passes its set); by default
    :func:`~.extensions.builtin_extensions`.
    The lifespan opens/closes the upstream clients and applies the runtime tuning
    (:mod:`.runtime_tuning`); at shutdown it waits up to ``grace_s`` for open cycles to be
    recorded before the writer is closed.
    """
    if upstream is None:
        router = UpstreamRouter.from_config(config)
    elif isinstance(upstream, UpstreamRouter):
        router = upstream
    else:
        router = UpstreamRouter(dict.fromkeys(FAMILIES, upstream))
    exts = list(builtin_extensions() if extensions is None else extensions)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own_writer = writer is None
        w = writer if writer is not None else make_writer(database)
        state = ProxyState(database, config, w, router, instance=instance)
        app.state.proxy = state
        await router.start()
        await state.arms.start()
        tuning = ProxyTuning(quiet_gc=config.proxy.quiet_gc)
        await tuning.start()
        state.collector = tuning.collector
        try:
            for ext in exts:
                await ext.startup(state)
            yield
        finally:
            try:
                if not await state.wait_idle(grace_s):
                    log.warning("%d cycle(s) still open at shutdown", len(state.open_cycles))
                for ext in reversed(exts):
                    await ext.shutdown(state)
                if state.ingest is not None:  # uploads' processes (.ingest)
                    await asyncio.to_thread(state.ingest.close)
                await asyncio.to_thread(state.parser.close)  # large bodies' (.body_parser)
                await state.recorder.gate.close()  # rows held through an outage: a last try
                await router.stop()
                state.arms.close()
                if own_writer:
                    await asyncio.to_thread(close_writer, w)
            finally:
                await tuning.stop()  # after the drain: those streams are shaped too

    fast = {a: _protocol_endpoint(a) for a in PROTOCOLS}
    routes: list[BaseRoute] = [Route(path, endpoint, methods=["POST"])
                               for a, endpoint in fast.items()
                               for path in (a.routes or (a.path,))]
    routes += [
        Route("/", root, methods=["GET", "HEAD"]),
        guarded_route("/v1/messages/count_tokens", _count_tokens, adapter=MessagesAdapter,
                      needs=_FORWARDING),
        guarded_route("/v1beta/models/{model}:countTokens", _count_tokens,
                      adapter=GeminiAdapter, needs=_FORWARDING),
        guarded_route("/v1/models", _models, ["GET"]),
        guarded_route("/v1beta/models", _models, ["GET"], adapter=GeminiAdapter),
        Route("/flowtrial/v1/health", health, methods=["GET"]),
    ]
    paths = health_paths()
    for ext in exts:
        paths.update(ext.openapi())
    ctx = AppContext(database, config, page_secret, paths)
    for ext in exts:
        routes += ext.routes(ctx)
    return ProxyApp(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error,
                                         ClientDisconnect: _client_disconnect}, fast=fast)
