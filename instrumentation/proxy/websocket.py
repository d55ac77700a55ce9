"""The Responses WebSocket mode: ``ws://HOST/v1/responses`` (what Codex uses with
``supports_websockets = true``).

The participant key is checked at the handshake (``Authorization: Bearer`` or ``x-api-key``);
a missing or unknown key is refused with HTTP 401 and an OpenAI error body before the socket
is accepted. Once accepted, the client sends ``{"type": "response.create", …}`` messages (a
Responses request body without ``stream``), one turn at a time, later turns chaining with
``previous_response_id``; the Responses events come back as text messages.

Each generating turn is a cycle (``transport = "websocket"``, ``turn`` = 1, 2, … on the
connection, ``connection_id`` shared by the connection's cycles), shaped and recorded exactly
as the SSE mode: the same adapter (:class:`ResponsesSocketAdapter`) and the same relay
(:class:`~flowtrial.instrumentation.proxy.cycle.Cycle`, given a :class:`SocketFrames` sink);
the turn's ``response.completed`` is
sent only once its row is durable.

Warm-ups (``generate: false``: no output, only ``response.created`` … ``response.completed``)
are passed through unshaped and **not recorded**: they produce nothing a participant waits
for, and recording them would consume per-prompt draws and muddle turn numbers. They do not
count as turns.

While the study database is unavailable a generating ``response.create`` gets an ``error``
message with status 503 (code ``database_unavailable``), and the socket stays open.

Errors are WebSocket ``error`` messages
(``{"type": "error", "status", "error": {type, code, message, param}}``) and the socket stays
open: invalid JSON, a message that is not ``response.create``, an oversized message (no cycle
is recorded), an upstream that cannot be reached (recorded as ``upstream_error``). A client
that disconnects mid-turn leaves the cycle recorded as ``abandoned``. A turn the upstream ends
with an ``error`` event is recorded first; the error goes out once the row is durable (else
the ``recording_failed`` error instead), like every turn's final event. Upstream error text
reaches the client and the row with the study's upstream keys and the participant's key
redacted. A message the proxy itself fails on (a bug) gets an ``error`` message (500,
``proxy_error``, logged) and the socket stays open; a connection it fails on is closed with
1011, never left without an answer.

A large message (``OFF_LOOP_BYTES`` and over) is read in the body parser's process
(:mod:`.socket_messages`), and a message over ``upstream.FRAGMENT_CHARS`` goes upstream in
fragments, so neither holds up other participants' tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import replace
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from .arms import NoAssignmentError
from .auth import (
    CREDENTIAL_HEADERS,
    ParticipantInfo,
    client_secrets,
)
from .body_parser import ParseBusy
from .cycle import Cycle
from .health import UNAVAILABLE_MESSAGE
from .hooks import HOOKS, Call, Needs, count_error, count_request, run_hooks
from .protocols.base import JsonFrames
from .protocols.responses import ResponsesAdapter, ResponsesSocketAdapter, ws_error
from .responses import foreign_response_message
from .runtime_tuning import give_way
from .scrub import Scrubber
from .socket_messages import SocketMessage
from .sources import Direct, Prefetch
from .state import ProxyState
from .upstream import (
    CYCLE_HEADER,
    UpstreamError,
    UpstreamSocket,
    forwardable_request_headers,
)

__all__ = ["SocketTurn", "serve_responses_socket"]

log = logging.getLogger("flowtrial.proxy")
_now = time.monotonic_ns


def _text(frame: bytes) -> str:
    return frame.decode("utf-8")


class _Connection:
    """One accepted client socket: its sends, its upstream session, its turn counter."""

    def __init__(self, state: ProxyState, participant: ParticipantInfo, send: Any,
                 headers: dict[str, str], client_key: list[str] | None = None) -> None:
        self.state = state
        self.participant = participant
        #: The key the client authenticated with: only to redact it from error text.
        self.client_key = client_key
        self._send = send
        self.id = "conn_" + secrets.token_hex(8)
        self.turns = 0
        self.headers = headers
        self.upstream_name = ""
        self.model: str | None = None
        self._sockets: dict[str, UpstreamSocket] = {}  # upstream name -> its session
        self.closed = False

    async def send(self, frame: bytes) -> None:
        try:
            await self._send({"type": "websocket.send", "text": _text(frame)})
        except OSError:  # uvicorn's ClientDisconnected: the socket is gone (or was closed)
            self.closed = True
            raise

    def upstream(self, arm: str | None = None) -> UpstreamSocket:
        """The upstream session for ``arm`` (its named upstream, else ``[upstream.openai]``;
        one per upstream, opened on first use; raises UpstreamError). Sets
        ``upstream_name`` and ``model`` (the arm's model, None: the client's own)."""
        route = self.state.upstreams.route(arm or "", "openai")
        self.model = route.model
        up = route.upstream
        if up is None:
            raise UpstreamError(501, "this proxy has no upstream for the responses "
                                     f"protocol: {route.why}")
        self.upstream_name = up.name
        sock = self._sockets.get(up.name)
        if sock is None:
            sock = self._sockets[up.name] = up.open_socket(self.headers)
        return sock

    async def close(self) -> None:
        for sock in self._sockets.values():
            await sock.close()


class SocketFrames:
    """The Responses WebSocket sink of a cycle: one text frame per output event."""

    #: No keep-alive frames: the server's own ping frames keep the socket alive.
    keepalive_frames = False

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    async def emit(self, frames: list[bytes]) -> None:
        send = self.conn.send
        for f in frames:
            await send(f)

    async def emit_keepalive(self) -> None:
        return None

    async def emit_last(self, frame: bytes) -> None:
        if frame:
            await self.conn.send(frame)

    def client_key(self) -> list[str] | None:
        return self.conn.client_key


class SocketTurn:
    """One generating ``response.create`` on a connection: a cycle."""

    def __init__(self, conn: _Connection, read: SocketMessage, t_request_ns: int) -> None:
        adapter = ResponsesSocketAdapter()
        assert read.view is not None  # a response.create (SocketMessage)
        info = replace(read.view, stream=True)
        conn.turns += 1
        self.state = conn.state
        self.adapter = adapter
        self.cycle = Cycle(conn.state, adapter, conn.participant, info, t_request_ns,
                           transport=SocketFrames(conn), recorder=conn.state.recorder,
                           transport_name="websocket", turn=conn.turns, connection_id=conn.id)
        self.rec = self.cycle.rec
        self.conn = conn
        self.read = read
        conn.state.turns.arrive_view(self.rec, info, read.input_key, read.request_bytes,
                                     conn.headers)

    @property
    def finalizing(self) -> bool:
        return self.cycle.finalizing

    async def run(self) -> None:
        """Answer the turn and record it; a cancellation (client gone) records it abandoned."""
        st, rec, cycle = self.state, self.rec, self.cycle
        st.open_cycle(rec.id, rec.participant_id)
        try:
            await self._run()
        except asyncio.CancelledError:
            if not cycle.finalizing:
                await cycle.abandon("client disconnected" if self.conn.closed
                                    else "proxy shut down mid-answer")
            raise
        except Exception as exc:  # noqa: BLE001 - record it, tell the client, keep the socket
            if self.conn.closed and not cycle.finalizing:  # the socket went away mid-send
                await cycle.abandon("client disconnected")
                return
            log.exception("cycle %s failed", rec.id)
            recorded = False
            if not cycle.finalizing:
                recorded = await cycle.abandon(f"proxy error: {type(exc).__name__}: {exc}",
                                               "error")
            if not self.conn.closed:
                try:
                    await self.conn.send(ws_error(
                        "flowtrial proxy error" + (" (recorded)" if recorded else "")
                        + ": see the proxy's log", "server_error", "proxy_error"))
                except Exception:  # noqa: BLE001 - the socket died too
                    pass
        finally:
            st.close_cycle(rec.id)

    async def _run(self) -> None:
        st, rec, adapter, cycle = self.state, self.rec, self.adapter, self.cycle
        try:
            await cycle.resolve()
        except NoAssignmentError as exc:
            count_error(st)
            await self.conn.send(ws_error(str(exc), "invalid_request_error", "no_assignment",
                                          403))
            return
        try:
            sock = self.conn.upstream(rec.arm)
            rec.upstream = self.conn.upstream_name
            await sock.connect()
        except UpstreamError as exc:
            rec.upstream = self.conn.upstream_name
            message = cycle.scrub().text(exc.message)
            rec.status, rec.http_status, rec.error = "upstream_error", exc.status, message
            code = exc.code()
            await cycle.finish_stream(ws_error(message, "server_error", code, exc.status))
            return
        try:
            create = await self._create()
        except ParseBusy as exc:
            count_error(st)
            rec.status, rec.http_status, rec.error = "error", 503, exc.message
            await cycle.finish_stream(ws_error(exc.message, "server_error", "parse_busy", 503))
            return
        events = sock.turn(create, {CYCLE_HEADER: rec.id})
        rec.http_status = 101
        kind = Prefetch if cycle.pacer is not None else Direct
        src = kind(events, adapter, rec, JsonFrames())
        try:
            tail = await cycle.relay(src)
        finally:
            # A turn the relay left unfinished must not leave its events to the next turn.
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
        status = adapter.last_error_status
        if rec.status == "upstream_error" and status is not None and 400 <= status < 500:
            rec.status = "error"  # the upstream refused the request: the client's fault
        await cycle.finish_stream(tail)

    async def _create(self) -> dict[str, Any] | str:
        """The message to send upstream: as it came (a large one as its text), the arm's model
        in place of the client's (a large one rewritten off the loop, .body_parser)."""
        read, model = self.read, self.conn.model
        if model is None or model == read.model:
            return read.message if read.message is not None else read.text or ""
        self.rec.served_model = model  # the arm's model replaces the client's
        if read.message is not None:
            return {**read.message, "model": model}
        _, body = await self.state.parser.with_model(
            "responses", None, "/v1/responses", (read.text or "").encode(), model)
        return body.decode()


async def _deny(send: Any, answer: Response) -> None:
    """Refuse the handshake with ``answer`` as its HTTP response (status, headers such as
    Retry-After, the error body)."""
    await send({"type": "websocket.http.response.start", "status": answer.status_code,
                "headers": answer.raw_headers})
    await send({"type": "websocket.http.response.body", "body": bytes(answer.body)})


async def serve_responses_socket(state: ProxyState, scope: Any, receive: Any,
                                 send: Any) -> None:
    """The ASGI handler of one ``ws://…/v1/responses`` connection: its handshake runs the
    proxy's :data:`~.hooks.HOOKS` (counting, the database gate, the participant's key,
    consent and pass-through identity, error mapping) as every HTTP route does; a hook's
    answer refuses the handshake in OpenAI's error shape."""
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    # The handshake is an HTTP GET: the hooks read it as one (no body: Needs(body=False)).
    request = Request({**scope, "type": "http", "method": "GET"})
    call = Call(request, state, ResponsesAdapter(), _HANDSHAKE)  # HTTP error shape

    async def accept(call: Call) -> Response | None:
        return await _admitted(call, receive, send)

    answer = await run_hooks(HOOKS, call, accept)
    if isinstance(answer, Response):  # refused before the connection was accepted
        if "websocket.http.response" in scope.get("extensions", {}):
            await _deny(send, answer)
        else:
            await send({"type": "websocket.close", "code": 1008})


#: What the handshake asks of the hooks: a participant, their own credential kept apart
#: under pass-through; no body (a GET).
_HANDSHAKE = Needs(body=False, own_credential=True)


async def _admitted(call: Call, receive: Any, send: Any) -> Response | None:
    """A participant the hooks let in: the per-participant cap, then the connection's turns."""
    state, participant = call.state, call.participant
    assert participant is not None  # Authentication set it (Needs.auth)
    # Add, then check (across --workers): two workers admitting at the same instant both
    # see the other's claim, so the cap can never be passed.
    state.websockets.add(participant.id, 1)
    open_now = state.websockets.total(participant.id) - 1
    if open_now >= state.config.proxy.max_websockets_per_participant:
        state.websockets.add(participant.id, -1)
        return call.error(429, f"this participant already has {open_now} WebSocket "
                               "connections open (proxy.max_websockets_per_participant): "
                               "close one, or use it for the next turn",
                          code="too_many_websockets")
    try:
        up = state.upstreams.for_family("openai")
        await _serve(state, participant, Headers(scope=call.request.scope), receive, send, up,
                     call.path_key)
    except Exception:  # noqa: BLE001 - accepted: no HTTP answer can follow, so log it here
        log.exception("Responses WebSocket of participant %s failed", participant.id)
    finally:
        state.websockets.add(participant.id, -1)
    return None


async def _serve(state: ProxyState, participant: Any, headers: Headers, receive: Any,
                 send: Any, up: Any, path_key: str | None) -> None:
    """One accepted connection's turns, until it closes (or idles past
    ``proxy.ws_idle_timeout_s`` between turns: closed 1000)."""
    await send({"type": "websocket.accept"})
    idle_s = state.config.proxy.ws_idle_timeout_s
    forwarded = forwardable_request_headers(headers)
    if up is not None and up.credentials == "participant":  # pass-through: theirs goes up
        forwarded.update({h: v for h in CREDENTIAL_HEADERS if (v := headers.get(h))})
    conn = _Connection(state, participant, send, forwarded, client_secrets(headers, path_key))
    inbox: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
    queued = 0  # bytes (characters) of the messages waiting in the inbox
    current: asyncio.Task[None] | None = None
    turn: SocketTurn | None = None

    idle_since = time.monotonic()  # the last message in, or the end of the last turn

    async def read() -> None:
        # Reads concurrently with a running turn, so a disconnect cancels it at once. Idle
        # time counts from the end of the last turn (or message): a turn is never cut.
        nonlocal queued, idle_since
        while True:
            busy = (current is not None and not current.done()) or not inbox.empty()
            left = idle_s if busy else idle_since + idle_s - time.monotonic()
            try:
                msg = await asyncio.wait_for(receive(), max(left, 0.001))
                idle_since = time.monotonic()
            except TimeoutError:
                if (current is not None and not current.done()) or not inbox.empty() or (
                        time.monotonic() - idle_since < idle_s):
                    continue
                conn.closed = True
                inbox.put_nowait(None)
                await send({"type": "websocket.close", "code": 1000,
                            "reason": "idle (proxy.ws_idle_timeout_s)"})
                return
            if msg["type"] == "websocket.disconnect":
                conn.closed = True
                if current is not None and not current.done() and turn is not None \
                        and not turn.finalizing:
                    current.cancel()
                inbox.put_nowait(None)
                return
            if msg["type"] == "websocket.receive":
                raw = msg.get("text")
                if raw is None:
                    raw = (msg.get("bytes") or b"").decode("utf-8", "replace")
                if queued + len(raw) > state.ws_inbox_bytes:
                    # Messages sent faster than turns end would queue without bound: a
                    # policy violation (1008); the running turn ends as abandoned.
                    log.warning("websocket connection %s: more than %d bytes of messages "
                                "waiting (proxy.ws_inbox_bytes): closed", conn.id,
                                state.ws_inbox_bytes)
                    conn.closed = True
                    if current is not None and not current.done() and turn is not None \
                            and not turn.finalizing:
                        current.cancel()
                    inbox.put_nowait(None)
                    await send({"type": "websocket.close", "code": 1008,
                                "reason": "too many queued messages (proxy.ws_inbox_bytes)"})
                    return
                queued += len(raw)
                inbox.put_nowait((time.monotonic_ns(), raw))

    reader = asyncio.create_task(read())
    try:
        while (item := await inbox.get()) is not None and not conn.closed:
            t_request, raw = item
            queued -= len(raw)
            await give_way()  # reading a large message must not hold up a due first token
            try:
                turn = await _next_turn(conn, raw, t_request)
            except Exception:  # noqa: BLE001 - a bug: say so, keep the socket for the next
                if conn.closed:
                    break
                log.exception("websocket connection %s: a message failed", conn.id)
                count_error(state)
                await conn.send(ws_error("flowtrial proxy error: see the proxy's log",
                                         "server_error", "proxy_error", 500))
                continue
            if turn is None:  # answered (a refusal, a warm-up), or the client is gone
                continue
            current = asyncio.create_task(turn.run())
            try:
                await current
            except asyncio.CancelledError:
                if not conn.closed:
                    raise  # the proxy is shutting down
            finally:
                idle_since = time.monotonic()
    except Exception:  # noqa: BLE001 - no cycle is open here
        if not conn.closed:  # not the client gone mid-send: end the socket visibly (1011)
            log.exception("websocket connection %s failed", conn.id)
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": 1011, "reason": "proxy error"})
    finally:
        reader.cancel()
        await conn.close()


async def _next_turn(conn: _Connection, raw: str, t_request: int) -> SocketTurn | None:
    """Read one message: the turn it asks for, or None once it is answered otherwise (a
    refusal in the protocol's shape, a warm-up relayed) or its client is gone."""
    state = conn.state
    try:  # a large message is read off the loop (.socket_messages)
        got = await state.parser.read_socket_message(raw, state.max_body_bytes)
    except ParseBusy as exc:
        count_error(state)
        await conn.send(ws_error(exc.message, "server_error", "parse_busy", 503))
        return None
    if conn.closed:  # gone while its message was read
        return None
    if got.error is not None:
        count_error(state)
        await conn.send(got.error)
        return None
    if got.warmup:
        await _warmup(conn, got)
        return None
    assert got.view is not None
    previous = got.view.previous_response_id
    count_request(state)
    if not state.recorder.gate.ok:  # the database is down: refuse, keep the socket
        count_error(state)
        state.recorder.gate.refused += 1
        await conn.send(ws_error(UNAVAILABLE_MESSAGE, "server_error", "database_unavailable",
                                 503))
        return None
    if await state.turns.foreign_response(conn.participant.id, previous):
        count_error(state)
        await conn.send(ws_error(foreign_response_message(previous),
                                 code="previous_response_not_found",
                                 param="previous_response_id", status=404))
        return None
    return SocketTurn(conn, got, t_request)


async def _warmup(conn: _Connection, read: SocketMessage) -> None:
    """Relay a ``generate: false`` warm-up as is (not a cycle: see the module doc), keys
    redacted (a handful of small frames, no answer text: an upstream error may quote a key)."""
    scrub = Scrubber.for_request(conn.state.config, conn.client_key)
    try:
        sock = conn.upstream()
        await sock.connect()
        message = read.message if read.message is not None else read.text or ""
        async for frame in sock.turn(message, {}):
            await conn.send(scrub.raw(frame))
    except UpstreamError as exc:
        count_error(conn.state)
        await conn.send(ws_error(scrub.text(exc.message), "server_error", exc.code(),
                                 exc.status))
