"""One proxied model request, end to end: the hot path of the instrument.

:class:`Exchange` is the ASGI callable a protocol route returns once the request is
authenticated and its body read (t_request). It resolves the arm (the only database reads,
all before the upstream call), calls the upstream, relays the answer through the shaper and
records the cycle:

- streams (the shaped relay itself is :class:`~flowtrial.instrumentation.proxy.cycle.Cycle`,
  shared with the WebSocket mode; :class:`HttpBody` is the sink this class gives it):
  headers and pre-content events (role chunk, ``response.created``, ``message_start``) go
  out as they arrive; text and tool-call events leave as the cycle's delivery strategy says
  (:mod:`~flowtrial.instrumentation.proxy.delivery`);
  keep-alives (``: keep-alive`` comments, Anthropic ``ping`` events) fill injected
  waits longer than ``proxy.keepalive_s``; the final event (``[DONE]``,
  ``response.completed``, ``message_stop``) is sent only after the cycle row is durable, and
  replaced by the protocol's error event if the write fails;
- non-streaming answers are held until t_request + ttft + n/tps; the row is submitted just
  ahead of the release (so a client that gives up during the hold is recorded as abandoned)
  and the body is sent once it is durable (else 503);
- the client's query string (Claude Code's ``?beta=true``) is passed to the upstream;
- an upstream that breaks the protocol fails loudly (502, recorded ``upstream_error``) rather
  than hand the client something it cannot parse: a whole answer that is not a JSON object,
  a streaming request answered without an event stream (one merely labelled ``text/plain``
  is relayed as the stream it is); an error status with a non-JSON body (a load balancer's
  HTML page) is wrapped into the protocol's error shape, its headers (``retry-after``) kept;
- a client disconnect cancels the exchange and records it as ``abandoned`` with what had been
  sent; so does a shutdown that outlasts the grace period;
- an upstream's error (its error body, a transport failure's message) is relayed and recorded
  with the study's upstream keys and the participant's own key redacted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..tokens import count_tokens
from .arms import NoAssignmentError
from .auth import CREDENTIAL_HEADERS, ParticipantInfo, client_secrets
from .body_parser import ParseBusy
from .cycle import Cycle
from .hooks import count_error
from .protocols.base import ProtocolAdapter, RequestInfo, SSEParser
from .shaping import RELEASE_SPIN_NS, sleep_until
from .sources import Direct, Prefetch
from .state import ProxyState
from .upstream import (
    CYCLE_HEADER,
    UpstreamError,
    UpstreamReply,
    forwardable_request_headers,
)

__all__ = ["Exchange"]

log = logging.getLogger("flowtrial.proxy")
_now = time.monotonic_ns
_BODY = "http.response.body"


def _status_kind(status: int) -> str:
    """Cycle status for an upstream HTTP error: the client's fault or the upstream's."""
    return "error" if 400 <= status < 500 and status not in (408, 429) else "upstream_error"


_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


def _is_json_object(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError):
        return False


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:1000]
    except (ValueError, AttributeError):
        pass
    return body[:1000].decode("utf-8", "replace")


class HttpBody:
    """The HTTP + SSE sink of a cycle: output frames as response body chunks (or, for a
    client that asked Gemini for its JSON-array stream, as the array's elements)."""

    keepalive_frames = True

    def __init__(self, adapter: ProtocolAdapter, headers: Mapping[str, str],
                 path_key: str | None = None) -> None:
        self.adapter = adapter
        self.headers = headers
        self.path_key = path_key
        self.send: Any = None  # the ASGI send, once the exchange runs
        self.array: JsonArray | None = JsonArray() if getattr(
            adapter, "json_array", False) else None

    async def emit(self, frames: list[bytes]) -> None:
        if self.array is not None:
            frames = self.array.elements(frames)
        body = frames[0] if len(frames) == 1 else b"".join(frames)
        await self.send({"type": _BODY, "body": body, "more_body": True})

    async def emit_keepalive(self) -> None:
        await self.send({"type": _BODY, "body": self.adapter.keepalive(), "more_body": True})

    async def emit_last(self, frame: bytes) -> None:
        if self.array is not None:
            frame = b"".join(self.array.elements([frame] if frame else [])) + self.array.close()
        await self.send({"type": _BODY, "body": frame, "more_body": False})

    def client_key(self) -> list[str]:
        return client_secrets(self.headers, self.path_key)


class JsonArray:
    """SSE frames (``data: {…}``) rewritten as the elements of one JSON array written piece
    by piece (Gemini's stream without ``alt=sse``): ``[`` before the first, ``,`` between,
    ``]`` at the end."""

    def __init__(self) -> None:
        self.opened = False

    def elements(self, frames: list[bytes]) -> list[bytes]:
        out = []
        for frame in frames:
            for line in frame.splitlines():
                if line.startswith(b"data:"):
                    out.append((b",\r\n" if self.opened else b"[") + line[5:].strip())
                    self.opened = True
        return out

    def close(self) -> bytes:
        return b"]" if self.opened else b"[]"


class Exchange:
    """ASGI callable that answers one proxied model request and records its cycle."""

    def __init__(self, state: ProxyState, adapter: ProtocolAdapter, participant: ParticipantInfo,
                 body: bytes, info: RequestInfo, headers: Mapping[str, str],
                 t_request_ns: int, query: str = "", path: str | None = None,
                 path_key: str | None = None) -> None:
        self.state = state
        self.adapter = adapter
        self.info = info
        self.path_key = path_key
        self.sink = HttpBody(adapter, headers, path_key)
        self.cycle = Cycle(state, adapter, participant, info, t_request_ns,
                           transport=self.sink, recorder=state.recorder)
        self.rec = self.cycle.rec
        self.body = body
        self.headers = headers
        self.path = adapter.upstream_path(path or adapter.path, query)
        self.send: Any = None
        self.started = False  # response headers sent
        self.last_write = t_request_ns  # whole answers: when a keep-alive byte last went out

    # ------------------------------------------------------------------ ASGI entry
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.send = self.sink.send = send
        st, rec, cycle = self.state, self.rec, self.cycle
        st.open_cycle(rec.id, rec.participant_id)
        main = asyncio.current_task()
        assert main is not None
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    disconnected = True
                    if not cycle.finalizing:
                        main.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self._run()
        except asyncio.CancelledError:
            if not cycle.finalizing:
                why = "client disconnected" if disconnected else "proxy shut down mid-answer"
                await cycle.abandon(why, started=self.started)
            if not disconnected:
                raise
            main.uncancel()  # the client is gone; nothing left to cancel
        except Exception as exc:
            # A bug or an unexpected upstream shape: still record the cycle, answer 500.
            log.exception("cycle %s failed", rec.id)
            recorded = False
            if not cycle.finalizing:
                recorded = await cycle.abandon(f"proxy error: {type(exc).__name__}: {exc}",
                                               "error", started=self.started)
            if self.started:
                raise
            # "recorded" only when a row exists (a held one is written later: not yet).
            await self._send_whole(500, self.adapter.error_body(
                "flowtrial proxy error" + (" (recorded)" if recorded else "")
                + ": see the proxy's log", "server_error", "proxy_error"))
        finally:
            watcher.cancel()
            st.close_cycle(rec.id)

    # ------------------------------------------------------------------ the exchange
    async def _run(self) -> None:
        st, rec, adapter = self.state, self.rec, self.adapter
        try:
            await self.cycle.resolve()
        except NoAssignmentError as exc:
            count_error(st)
            await self._send_whole(403, adapter.error_body(str(exc), code="no_assignment"))
            return
        route = st.upstreams.route(rec.arm, adapter.family.name)
        upstream = route.upstream
        if upstream is None:
            await self._fail(501, f"this proxy has no upstream for the {adapter.name} protocol: "
                                  f"{route.why}", "upstream_error", "no_upstream")
            return
        rec.upstream = upstream.name
        path, body = self.path, self.body
        if route.model is not None and route.model != self.info.model:
            # The arm's model replaces the client's (a JSON body re-written, or the URL).
            rec.served_model = route.model
            try:  # a large body is rewritten off the loop (.body_parser)
                path, body = await st.parser.with_model(
                    adapter.name, adapter.url_params or None, path, body, route.model)
            except ParseBusy as exc:
                await self._fail(503, exc.message, "server_error", "parse_busy")
                return
        headers = forwardable_request_headers(self.headers)
        if upstream.credentials == "participant":
            headers.update(self._own_credential())
        headers[CYCLE_HEADER] = rec.id
        try:
            reply = await upstream.request("POST", path, headers, body)
        except UpstreamError as exc:
            await self._fail(exc.status, exc.message, "upstream_error", exc.code())
            return
        try:
            if reply.status >= 400:
                await self._forward_error(reply)
            elif reply.is_event_stream:
                await self._relay_stream(reply)
            elif self.info.stream and reply.status == 200:
                await self._relay_unlabelled(reply)
            else:
                await self._relay_whole(reply)
        finally:
            await reply.close()

    def _own_credential(self) -> dict[str, str]:
        """The participant's own provider credential, passed through as it came (the auth
        check made sure they were identified apart from it)."""
        return {h: v for h in CREDENTIAL_HEADERS if (v := self.headers.get(h))}

    # ------------------------------------------------------------------ sending
    def _headers(self, reply_headers: list[tuple[str, str]] | None, content_type: str,
                 length: int | None, stream: bool = False) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", content_type.encode("latin-1"))]
        if stream:
            out += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        own = {k.decode() for k, _ in out}
        for k, v in reply_headers or ():
            if k not in own:
                out.append((k.encode("latin-1"), v.encode("latin-1")))
        if length is not None:
            out.append((b"content-length", str(length).encode()))
        out.append((CYCLE_HEADER.encode(), self.rec.id.encode()))
        return out

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True
        self.rec.http_status = status

    async def _send_whole(self, status: int, body: bytes, content_type: str = "application/json",
                          reply_headers: list[tuple[str, str]] | None = None) -> None:
        await self._start(status, self._headers(reply_headers, content_type, len(body)))
        await self.send({"type": _BODY, "body": body, "more_body": False})

    async def _record_then_send(self, status: int, body: bytes, content_type: str,
                                reply_headers: list[tuple[str, str]] | None = None) -> None:
        """Record the cycle, then answer; a failed write answers 503 instead."""
        self.cycle.finalizing = True
        self.rec.t_done_ns = _now()
        if self.rec.http_status is None:
            self.rec.http_status = status
        try:
            await self.cycle.record()
        except Exception:  # noqa: BLE001 - fail loudly, never pass traffic unrecorded
            count_error(self.state)
            await self._send_whole(503, self._recording_failed_body())
            return
        await self._send_whole(status, body, content_type, reply_headers)

    def _recording_failed_body(self) -> bytes:
        return self.adapter.error_body(
            "flowtrial could not record this request, so its answer is withheld: check the "
            "proxy's database", "server_error", "recording_failed")

    async def _fail(self, status: int, message: str, type_: str, code: str) -> None:
        rec = self.rec
        message = self.cycle.scrub().text(message)  # may quote the upstream (a close reason ...)
        rec.status = "upstream_error" if status >= 500 else "error"
        rec.http_status = status
        rec.error = message
        count_error(self.state)
        await self._record_then_send(status, self.adapter.error_body(message, type_, code),
                                     "application/json")

    async def _forward_error(self, reply: UpstreamReply) -> None:
        rec = self.rec
        try:
            body = b"".join([c async for c in reply.body])
        except UpstreamError as exc:
            await self._fail(exc.status, exc.message, "upstream_error", "upstream_error")
            return
        rec.t_upstream_first_ns = _now()
        # An upstream refusing a key may quote it: redact before recording, cutting or relaying.
        body = self.cycle.scrub().raw(body)
        rec.status = _status_kind(reply.status)
        rec.http_status = reply.status
        rec.error = _error_text(body)
        count_error(self.state)
        content_type = reply.content_type or "application/json"
        if not _is_json_object(body):
            # An HTML page from a load balancer, an empty body ...: the client gets the
            # protocol's error shape (the upstream's headers, e.g. retry-after, still pass).
            detail = " ".join(rec.error.split())[:200] or "no body"
            body = self.adapter.error_body(
                f"upstream answered HTTP {reply.status}: {detail}", "upstream_error",
                "upstream_error")
            content_type = "application/json"
        await self._record_then_send(reply.status, body, content_type, reply.headers)

    async def _relay_unlabelled(self, reply: UpstreamReply) -> None:
        """A 200 to a streaming request that is not labelled ``text/event-stream``: relay it
        as a stream (shaped and recorded) if it is one (some servers send ``text/plain``),
        else fail with 502 — passing it on would hand the client an answer it cannot parse,
        unshaped."""
        rec = self.rec
        head = b""
        rest = reply.body.__aiter__()
        try:
            while len(head.lstrip()) < 6:
                chunk = await anext(rest, None)
                if chunk is None:
                    break
                if rec.t_upstream_first_ns is None:
                    rec.t_upstream_first_ns = _now()
                head += chunk
        except UpstreamError as exc:
            await self._fail(exc.status, exc.message, "upstream_error", exc.code())
            return
        if not head.lstrip().startswith(_SSE_STARTS):
            await self._fail(502, "upstream answered a streaming request with "
                                  f"{reply.content_type or 'no content type'}, not an event "
                                  "stream", "upstream_error", "upstream_bad_response")
            return

        async def body() -> AsyncIterator[bytes]:
            yield head
            async for chunk in rest:
                yield chunk

        headers = [(k, v) for k, v in reply.headers if k.lower() != "content-type"]
        await self._relay_stream(UpstreamReply(
            reply.status, [("content-type", "text/event-stream"), *headers], body()))

    # ------------------------------------------------------------------ streaming
    async def _relay_stream(self, reply: UpstreamReply) -> None:
        await self._start(reply.status, self._headers(
            reply.headers, reply.content_type or "text/event-stream", None, stream=True))
        cycle = self.cycle
        kind = Prefetch if cycle.pacer is not None else Direct
        src = kind(reply.body, self.adapter, self.rec, SSEParser())
        await cycle.finish_stream(await cycle.relay(src))

    # ------------------------------------------------------------------ non-streaming
    async def _relay_whole(self, reply: UpstreamReply) -> None:
        rec, adapter, pacer, st = self.rec, self.adapter, self.cycle.pacer, self.state
        chunks = []
        try:
            async for chunk in reply.body:
                if rec.t_upstream_first_ns is None:
                    rec.t_upstream_first_ns = _now()
                chunks.append(chunk)
        except UpstreamError as exc:
            await self._fail(exc.status, exc.message, "upstream_error", exc.code())
            return
        body = b"".join(chunks)
        ready = rec.t_upstream_last_ns = _now()
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            # Cut short or not JSON: the client could not parse it either (its bytes are not
            # quoted: they may be answer content).
            ctype = reply.content_type or "no content type"
            await self._fail(502, "upstream answered with a body that is not a JSON object "
                                  f"({len(body)} bytes, {ctype})", "upstream_error",
                             "upstream_bad_response")
            return
        info = adapter.read_body(obj)
        text = info.text
        rec.usage, rec.tool_calls, rec.upstream_response_id = (
            info.usage, info.tool_calls, info.response_id)
        if text or info.tool_calls:  # one body: its output arrived with its last byte
            rec.t_upstream_first_output_ns = ready
        # Text and tool-call arguments, as a stream of the same answer would count them.
        ntok = count_tokens(text) + count_tokens(info.tool_args)
        due = ready
        if pacer is not None:
            _, completion = adapter.usage_counts(rec.usage)
            due = pacer.due_all(completion if completion is not None else ntok)
        release = max(due, ready)
        rec.sent(release, due if pacer else None, due if pacer else None)
        rec.tokens_sent = ntok
        rec.content_parts = [text]
        headers = self._headers(reply.headers, reply.content_type or "application/json",
                                None)
        # Hold until just before the release; a long hold keeps the connection alive with
        # JSON-insignificant whitespace (the body's headers are then sent early, chunked).
        submit_at = release - st.recorder.lead_ns()
        if submit_at - _now() > st.keepalive_ns:
            await self._start(reply.status, headers)
            self.last_write = _now()
            await self._wait_whole(submit_at)
        elif submit_at > _now():
            await sleep_until(submit_at)
        self.cycle.finalizing = True
        rec.t_done_ns = release
        rec.http_status = reply.status
        try:
            await self.cycle.record()
        except Exception:  # noqa: BLE001 - never release an unrecorded answer
            count_error(st)
            if self.started:  # too late for a status: break the body so the client errors
                raise
            await self._send_whole(503, self._recording_failed_body())
            return
        await sleep_until(release, RELEASE_SPIN_NS)
        if not self.started:
            headers.append((b"content-length", str(len(body)).encode()))
            await self._start(reply.status, headers)
        await self.send({"type": _BODY, "body": body, "more_body": False})

    async def _wait_whole(self, until: int) -> None:
        ka = self.state.keepalive_ns
        while (now := _now()) < until:
            nxt = self.last_write + ka
            if nxt >= until:
                await sleep_until(until)
                return
            if nxt > now:
                await sleep_until(nxt)
            await self.send({"type": _BODY, "body": b"\n", "more_body": True})
            self.last_write = _now()
