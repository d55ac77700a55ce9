"""One proxied model request, end to end: the hot path of the instrument.

:class:`Exchange` is the ASGI callable a protocol route returns once the request is
authenticated and its body read (t_request). It resolves the arm (the only database reads,
all before the upstream call), calls the upstream, relays the answer through the shaper and
records the cycle:

- streams: headers and pre-content events (role chunk, ``response.created``) go out as they
  arrive; output events are released on the :class:`~instrumentation.proxy.shaping.Pacer`'s
  schedule, split into token-sized whole events when there is a pace to keep; keep-alives fill
  injected waits longer than ``proxy.keepalive_s``; the final event (``[DONE]``,
  ``response.completed``) is sent only after the cycle row is durable, and replaced by the
  protocol's error event if the write fails;
- non-streaming answers are held until t_request + ttft + n/tps; the row is submitted just
  ahead of the release (so a client that gives up during the hold is recorded as abandoned)
  and the body is sent once it is durable (else 503);
- a client disconnect cancels the exchange and records it as ``abandoned`` with what had been
  sent; so does a shutdown that outlasts the grace period.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from instrumentation.proxy.arms import NoAssignmentError
from instrumentation.proxy.auth import ParticipantInfo
from instrumentation.proxy.protocols.base import Classified, Kind, ProtocolAdapter, RequestInfo
from instrumentation.proxy.recorder import CycleRecord
from instrumentation.proxy.shaping import Pacer, sleep_until
from instrumentation.proxy.sources import Direct, Prefetch
from instrumentation.proxy.state import ProxyState, new_cycle_id
from instrumentation.proxy.upstream import (
    CYCLE_HEADER,
    UpstreamError,
    UpstreamReply,
    forwardable_request_headers,
)
from instrumentation.tokens import count_tokens, split_tokens

__all__ = ["Exchange"]

log = logging.getLogger("flowtrial.proxy")
_now = time.monotonic_ns
_BODY = "http.response.body"


def _status_kind(status: int) -> str:
    """Cycle status for an upstream HTTP error: the client's fault or the upstream's."""
    return "error" if 400 <= status < 500 and status not in (408, 429) else "upstream_error"


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:1000]
    except (ValueError, AttributeError):
        pass
    return body[:1000].decode("utf-8", "replace")


class Exchange:
    """ASGI callable that answers one proxied model request and records its cycle."""

    def __init__(self, state: ProxyState, adapter: ProtocolAdapter, participant: ParticipantInfo,
                 body: bytes, info: RequestInfo, headers: Mapping[str, str],
                 t_request_ns: int) -> None:
        self.state = state
        self.adapter = adapter
        self.body = body
        self.info = info
        self.headers = headers
        self.rec = CycleRecord(
            id=new_cycle_id(), participant_id=participant.id, protocol=adapter.name,
            stream=info.stream, model=info.model, upstream="", t_request_ns=t_request_ns,
            mono_anchor_ns=state.mono_anchor_ns, wall_anchor_ns=state.wall_anchor_ns,
            started_at=datetime.fromtimestamp(
                (state.wall_anchor_ns + t_request_ns - state.mono_anchor_ns) / 1e9, UTC),
            simulated=participant.simulated, prompt_text=info.prompt_text,
        )
        self.pacer: Pacer | None = None
        self._task_lookup: asyncio.Future[int | None] | None = None
        self.send: Any = None
        self.started = False  # response headers sent
        self.finalizing = False  # the row is being made durable: a disconnect no longer cancels
        self.last_write = t_request_ns
        self._out: list[bytes] = []
        self._pend_texts: list[str] = []
        self._pend_tokens = 0
        self._pend_output = False
        self._pend_min: int | None = None
        self._pend_max: int | None = None

    @property
    def cycle_id(self) -> str:
        return self.rec.id

    # ------------------------------------------------------------------ ASGI entry
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.send = send
        st, rec = self.state, self.rec
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
                    if not self.finalizing:
                        main.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self._run()
        except asyncio.CancelledError:
            if not self.finalizing:
                why = "client disconnected" if disconnected else "proxy shut down mid-answer"
                await self._abandon(why)
            if not disconnected:
                raise
            main.uncancel()  # the client is gone; nothing left to cancel
        except Exception as exc:
            # A bug or an unexpected upstream shape: still record the cycle, answer 500.
            log.exception("cycle %s failed", rec.id)
            if not self.finalizing:
                await self._abandon(f"proxy error: {type(exc).__name__}: {exc}", "error")
            if self.started:
                raise
            await self._send_whole(500, self.adapter.error_body(
                "flowtrial proxy error (recorded): see the proxy's log", "server_error",
                "proxy_error"))
        finally:
            watcher.cancel()
            st.close_cycle(rec.id)

    async def _record(self) -> None:
        """Make the cycle durable (raises if the write fails)."""
        if self._task_lookup is not None:
            try:
                self.rec.task_id = await asyncio.shield(self._task_lookup)
            except Exception:  # noqa: BLE001 - a label only; the cycle must still be recorded
                log.warning("task lookup failed for cycle %s", self.rec.id, exc_info=True)
            self._task_lookup = None
        await self.state.recorder.record(self.rec)

    async def _abandon(self, why: str, status: str = "abandoned") -> None:
        rec = self.rec
        self.finalizing = True
        rec.status = status
        rec.error = why
        rec.http_status = rec.http_status or (200 if self.started else 499)
        rec.t_done_ns = _now()
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - nobody is left to tell; the counter shows it
            self.state.errors += 1

    # ------------------------------------------------------------------ the exchange
    async def _run(self) -> None:
        st, rec, adapter = self.state, self.rec, self.adapter
        try:
            res = await st.arms.resolve(rec.participant_id)
        except NoAssignmentError as exc:
            st.errors += 1
            await self._send_whole(403, adapter.error_body(str(exc), code="no_assignment"))
            return
        rec.arm, rec.target, rec.period = res.arm, res.target, res.period
        rec.task_id, rec.draw_json = res.task_id, res.draw_json
        self._task_lookup = res.task_lookup
        if res.target is not None:
            self.pacer = Pacer(res.target, rec.t_request_ns, seed=rec.id)
        upstream = st.upstreams.for_family(adapter.family)
        if upstream is None:
            await self._fail(501, f"this proxy has no upstream for the {adapter.name} protocol: "
                                  f"add [upstream.{adapter.family}] to the study file",
                             "upstream_error", "no_upstream")
            return
        rec.upstream = upstream.name
        headers = forwardable_request_headers(self.headers)
        headers[CYCLE_HEADER] = rec.id
        try:
            reply = await upstream.request("POST", adapter.path, headers, self.body)
        except UpstreamError as exc:
            code = "upstream_timeout" if exc.status == 504 else "upstream_unreachable"
            await self._fail(exc.status, exc.message, "upstream_error", code)
            return
        try:
            if reply.status >= 400:
                await self._forward_error(reply)
            elif reply.is_event_stream:
                await self._relay_stream(reply)
            else:
                await self._relay_whole(reply)
        finally:
            await reply.close()

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
        self.finalizing = True
        self.rec.t_done_ns = _now()
        if self.rec.http_status is None:
            self.rec.http_status = status
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - fail loudly, never pass traffic unrecorded
            self.state.errors += 1
            await self._send_whole(503, self._recording_failed_body())
            return
        await self._send_whole(status, body, content_type, reply_headers)

    def _recording_failed_body(self) -> bytes:
        return self.adapter.error_body(
            "flowtrial could not record this request, so its answer is withheld: check the "
            "proxy's database", "server_error", "recording_failed")

    async def _fail(self, status: int, message: str, type_: str, code: str) -> None:
        rec = self.rec
        rec.status = "upstream_error" if status >= 500 else "error"
        rec.http_status = status
        rec.error = message
        self.state.errors += 1
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
        rec.status = _status_kind(reply.status)
        rec.http_status = reply.status
        rec.error = _error_text(body)
        self.state.errors += 1
        await self._record_then_send(reply.status, body, reply.content_type or "application/json",
                                     reply.headers)

    # ------------------------------------------------------------------ streaming
    async def _flush(self) -> None:
        out = self._out
        body = out[0] if len(out) == 1 else b"".join(out)
        self._out = []
        await self.send({"type": _BODY, "body": body, "more_body": True})
        now = _now()
        self.last_write = now
        if self._pend_output:
            rec = self.rec
            rec.sent(now, self._pend_min, self._pend_max)
            rec.tokens_sent += self._pend_tokens
            rec.content_parts.extend(self._pend_texts)
            self._pend_texts = []
            self._pend_tokens = 0
            self._pend_output = False
            self._pend_min = self._pend_max = None

    def _push(self, raw: bytes, text: str, ntok: int, due: int | None) -> None:
        self._out.append(raw)
        self._pend_texts.append(text)
        self._pend_tokens += ntok
        self._pend_output = True
        if due is not None:
            if self._pend_min is None:
                self._pend_min = due
            self._pend_max = due  # dues only grow within a stream

    async def _wait(self, due: int) -> None:
        """Flush what is pending, then wait for ``due``, keeping the stream alive."""
        if self._out:
            await self._flush()
        ka = self.state.keepalive_ns
        while True:
            now = _now()
            if now >= due:
                return
            next_ka = self.last_write + ka
            if next_ka >= due:
                await sleep_until(due)
                return
            if next_ka > now:
                await sleep_until(next_ka)
            await self.send({"type": _BODY, "body": self.adapter.keepalive(), "more_body": True})
            self.last_write = _now()

    async def _paced(self, ev: Any, c: Classified, k: int, pacer: Pacer, arrival: int) -> int:
        """Release one output event on schedule (split into tokens if pacing); next k."""
        text = c.text
        pieces = split_tokens(text) if text else []
        n = len(pieces)
        if n > 1 and pacer.splits and c.text_key is not None:
            units: Any = zip(self.adapter.split(ev, c, pieces), pieces, strict=True)
            width = 1
        else:
            units = ((self.adapter.restamp(ev, c), text),)
            width = n
        for raw, piece in units:
            if k == 0 and pacer.base is None:
                due = pacer.first_due(arrival)
                if due > _now():
                    await self._wait(due)
                self._push(raw, piece, width, due)
                pacer.start(_now())
            else:
                due = pacer.due(k + width - 1 if width else k)
                if due > _now():
                    await self._wait(due)
                self._push(raw, piece, width, due)
            k += width
        return k

    def _note(self, c: Classified) -> None:
        rec = self.rec
        if c.usage is not None:
            rec.usage = c.usage
        if c.response_id and rec.upstream_response_id is None:
            rec.upstream_response_id = c.response_id
        rec.tool_calls += c.tool_calls
        if c.error is not None:
            rec.status = "upstream_error"
            rec.error = c.error[:1000]

    async def _relay_stream(self, reply: UpstreamReply) -> None:
        rec, adapter, pacer = self.rec, self.adapter, self.pacer
        await self._start(reply.status, self._headers(
            reply.headers, reply.content_type or "text/event-stream", None, stream=True))
        src = Prefetch(reply, adapter, rec) if pacer is not None else Direct(reply, adapter, rec)
        terminal: tuple[Any, Classified] | None = None
        tail = b""
        hold: list[bytes] | None = None  # all_at_once: everything from the first output on
        hold_texts: list[str] = []
        hold_tokens = 0
        k = 0
        try:
            while terminal is None:
                got = await src.get()
                if got is None:
                    break
                arrival, batch = got
                for ev, c in batch:
                    kind = c.kind
                    if kind is Kind.TERMINAL:
                        self._note(c)
                        terminal = (ev, c)
                        break
                    self._note(c)
                    if kind is Kind.CONTENT or kind is Kind.TOOL:
                        if pacer is None:
                            n = count_tokens(c.text) if c.text else 0
                            self._push(adapter.restamp(ev, c), c.text, n, None)
                        elif pacer.all_at_once:
                            if hold is None:
                                hold = []
                            hold.append(adapter.restamp(ev, c))
                            hold_texts.append(c.text)
                            hold_tokens += count_tokens(c.text) if c.text else 0
                        else:
                            k = await self._paced(ev, c, k, pacer, arrival)
                    elif hold is not None:
                        hold.append(adapter.restamp(ev, c))
                    else:
                        self._out.append(adapter.restamp(ev, c))
                if self._out and not src.ready():
                    await self._flush()
        except UpstreamError as exc:
            rec.status = "upstream_error"
            rec.error = exc.message
            tail = adapter.error_event(exc.message, "server_error", "upstream_error")
        finally:
            if terminal is not None:
                await src.drain()
            await src.close()
        if hold is not None and pacer is not None:
            _, completion = adapter.usage_counts(rec.usage)
            due = pacer.due_all(completion if completion is not None else hold_tokens)
            await self._wait(due)
            self._out.extend(hold)
            self._pend_texts, self._pend_tokens = hold_texts, hold_tokens
            self._pend_output, self._pend_min, self._pend_max = True, due, due
        if self._out:
            await self._flush()
        if terminal is not None and not tail:
            tail = adapter.restamp(*terminal)
        self.finalizing = True
        rec.t_done_ns = _now()
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - the final event must not go out unrecorded
            self.state.errors += 1
            await self.send({"type": _BODY, "body": adapter.error_event(
                "flowtrial could not record this request, so the stream is ended without its "
                "final event: check the proxy's database", "server_error", "recording_failed",
            ), "more_body": False})
            return
        if rec.status != "ok":
            self.state.errors += 1
        await self.send({"type": _BODY, "body": tail, "more_body": False})

    # ------------------------------------------------------------------ non-streaming
    async def _relay_whole(self, reply: UpstreamReply) -> None:
        rec, adapter, pacer, st = self.rec, self.adapter, self.pacer, self.state
        chunks = []
        try:
            async for chunk in reply.body:
                if rec.t_upstream_first_ns is None:
                    rec.t_upstream_first_ns = _now()
                chunks.append(chunk)
        except UpstreamError as exc:
            code = "upstream_timeout" if exc.status == 504 else "upstream_unreachable"
            await self._fail(exc.status, exc.message, "upstream_error", code)
            return
        body = b"".join(chunks)
        ready = _now()
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        text = ""
        if isinstance(obj, dict):
            info = adapter.read_body(obj)
            text = info.text
            rec.usage, rec.tool_calls, rec.upstream_response_id = (
                info.usage, info.tool_calls, info.response_id)
        ntok = count_tokens(text) if text else 0
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
        self.finalizing = True
        rec.t_done_ns = release
        rec.http_status = reply.status
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - never release an unrecorded answer
            st.errors += 1
            if self.started:  # too late for a status: break the body so the client errors
                raise
            await self._send_whole(503, self._recording_failed_body())
            return
        await sleep_until(release)
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
