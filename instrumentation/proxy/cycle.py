"""One cycle's shaped relay, independent of the transport it is delivered over.

:class:`CycleRun` holds what every proxied model answer shares: the cycle record, the arm
resolution (the only database reads, all before the upstream call), the pacer, and the relay
of a stream of classified upstream events to the client on the pacer's schedule. What a
transport adds is a *sink*: :meth:`CycleRun._emit` (output frames, in order),
:meth:`CycleRun._emit_keepalive` and :meth:`CycleRun._emit_last` (the final frame, sent only
once the row is durable). HTTP + SSE (:class:`~flowtrial.instrumentation.proxy.relay.Exchange`)
writes body chunks; the Responses WebSocket mode
(:class:`~flowtrial.instrumentation.proxy.websocket.SocketTurn`) sends one text frame per event.

Shaping rules (docs/concepts/shaping.md): answer text is released on the schedule (split into
token-sized whole events when there is a pace to keep; the TTFT floor holds the first text token).
Tool-call / function-call events are passed on **as they arrive** — after any text already
released, never re-split, never delayed by the floor — and counted in ``tool_calls``; they are
not part of the text timeline (TTFT, pace, ``tokens_sent``). Everything else (structure,
usage, unknown event types) goes out on arrival; ``all_at_once`` holds everything from the
first text on.

A stream the upstream breaks ends with the protocol's error event after what was already
sent, and the cycle is ``upstream_error``: the connection dies or stalls (``UpstreamError``), an
event's data is not JSON, or the body ends before the final event. SSE blocks without data
(a bare ``id:`` / ``retry:``) are dropped; comments pass. An upstream ``error`` event that
ends the stream (an Anthropic ``error``, a Responses WebSocket turn's ``error``) is its final
event: it too goes out only once the row is durable.

Upstream-derived error text (error events, ``UpstreamError`` messages) has the study's
upstream keys and the participant's key redacted (:mod:`~flowtrial.instrumentation.proxy.scrub`)
before it is recorded or relayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from ..tokens import count_tokens, split_tokens
from .auth import ParticipantInfo
from .protocols.base import Classified, Kind, ProtocolAdapter, RequestInfo
from .recorder import CycleRecord
from .scrub import Scrubber
from .shaping import RELEASE_SPIN_NS, Pacer, sleep_until
from .sources import Direct
from .state import ProxyState, new_cycle_id
from .upstream import UpstreamError

__all__ = ["CycleRun"]

log = logging.getLogger("flowtrial.proxy")
_now = time.monotonic_ns


class CycleRun:
    """The transport-independent part of one proxied answer (subclasses add the sink)."""

    #: Whether the transport needs keep-alive bytes during injected waits (SSE: yes;
    #: WebSocket: no, the server's own ping frames keep the socket alive).
    keepalive_frames: bool = True

    def __init__(self, state: ProxyState, adapter: ProtocolAdapter, participant: ParticipantInfo,
                 info: RequestInfo, t_request_ns: int, *, transport: str = "http",
                 turn: int = 1, connection_id: str | None = None) -> None:
        self.state = state
        self.adapter = adapter
        self.info = info
        self.rec = CycleRecord(
            id=new_cycle_id(), participant_id=participant.id, protocol=adapter.name,
            stream=info.stream, model=info.model, upstream="", t_request_ns=t_request_ns,
            mono_anchor_ns=state.mono_anchor_ns, wall_anchor_ns=state.wall_anchor_ns,
            started_at=datetime.fromtimestamp(
                (state.wall_anchor_ns + t_request_ns - state.mono_anchor_ns) / 1e9, UTC),
            simulated=participant.simulated, prompt_text=info.prompt_text,
            transport=transport, turn=turn, connection_id=connection_id,
        )
        self.pacer: Pacer | None = None
        self._task_lookup: asyncio.Future[int | None] | None = None
        self.finalizing = False  # the row is being made durable: a disconnect no longer cancels
        self.last_write = t_request_ns
        self._out: list[bytes] = []
        self._pend_texts: list[str] = []
        self._pend_tokens = 0
        self._pend_output = False
        self._pend_min: int | None = None
        self._pend_max: int | None = None
        self._scrubber: Scrubber | None = None

    @property
    def cycle_id(self) -> str:
        return self.rec.id

    # ------------------------------------------------------------------ sink (transport)
    async def _emit(self, frames: list[bytes]) -> None:
        """Send output frames, in order."""
        raise NotImplementedError

    async def _emit_keepalive(self) -> None:
        """Keep the connection alive during an injected wait."""

    async def _emit_last(self, frame: bytes) -> None:
        """Send the final frame (possibly empty) and end the answer."""
        raise NotImplementedError

    # ------------------------------------------------------------------ error text
    def _client_key(self) -> str | None:
        """The participant's key as their client sent it (redacted from error text)."""
        return None

    def _scrub(self) -> Scrubber:
        """Redacts keys from upstream-derived error text; built on first use, so only error
        paths read the key variables."""
        if self._scrubber is None:
            self._scrubber = Scrubber.for_request(self.state.config, self._client_key())
        return self._scrubber

    # ------------------------------------------------------------------ arm and record
    async def _resolve(self) -> None:
        """Resolve the arm and set up the pacer (raises NoAssignmentError)."""
        rec = self.rec
        res = await self.state.arms.resolve(rec.participant_id)
        rec.arm, rec.target, rec.period = res.arm, res.target, res.period
        rec.task_id, rec.draw_json = res.task_id, res.draw_json
        self._task_lookup = res.task_lookup
        if res.target is not None:
            self.pacer = Pacer(res.target, rec.t_request_ns, seed=rec.id)

    async def _record(self) -> None:
        """Make the cycle durable (raises if the write fails)."""
        if self._task_lookup is not None:
            try:
                self.rec.task_id = await asyncio.shield(self._task_lookup)
            except Exception:  # noqa: BLE001 - a label only; the cycle must still be recorded
                log.warning("task lookup failed for cycle %s", self.rec.id, exc_info=True)
            self._task_lookup = None
        if self.rec.error:  # the last stop before cycles.error: no key gets past it
            self.rec.error = self._scrub().text(self.rec.error)
        await self.state.recorder.record(self.rec, self.state.turns.recorded(self.rec))

    async def _abandon(self, why: str, status: str = "abandoned", started: bool = True) -> None:
        rec = self.rec
        self.finalizing = True
        rec.status = status
        rec.error = why
        rec.http_status = rec.http_status or (200 if started else 499)
        rec.t_done_ns = _now()
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - nobody is left to tell; the counter shows it
            self.state.errors += 1

    # ------------------------------------------------------------------ output buffer
    async def _flush(self) -> None:
        out = self._out
        self._out = []
        await self._emit(out)
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

    async def _wait(self, due: int, spin_ns: int = 0) -> None:
        """Flush what is pending, then wait for ``due``, keeping the stream alive."""
        if self._out:
            await self._flush()
        if not self.keepalive_frames:
            await sleep_until(due, spin_ns)
            return
        ka = self.state.keepalive_ns
        while True:
            now = _now()
            if now >= due:
                return
            next_ka = self.last_write + ka
            if next_ka >= due:
                await sleep_until(due, spin_ns)
                return
            if next_ka > now:
                await sleep_until(next_ka)
            await self._emit_keepalive()
            self.last_write = _now()

    async def _paced(self, ev: Any, c: Classified, k: int, pacer: Pacer, arrival: int) -> int:
        """Release one text event on schedule (split into tokens if pacing); next k."""
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
                    await self._wait(due, RELEASE_SPIN_NS)
                self._push(raw, piece, width, due)
                pacer.start(_now())
                # Out now: the source's next slice (or the next event) could yield first.
                await self._flush()
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
            rec.error = self._scrub().text(c.error)[:1000]  # redact before cutting

    # ------------------------------------------------------------------ the stream
    async def _relay_events(self, src: Direct) -> bytes:
        """Relay ``src`` up to its final event; returns the final frame to send once the row
        is durable (the terminal event, an error event, or b"" when the stream just ended)."""
        rec, adapter, pacer = self.rec, self.adapter, self.pacer
        terminal: tuple[Any, Classified] | None = None
        tail = b""
        # The upstream's error event, held back: if nothing follows it, it is the stream's
        # final event and goes out only once the row is durable.
        held_error: bytes | None = None
        hold: list[bytes] | None = None  # all_at_once: everything from the first text on
        hold_texts: list[str] = []
        hold_tokens = 0
        k = 0
        try:
            while terminal is None:
                got = await src.get()
                if got is None:
                    break
                arrival, batch = got
                rec.t_upstream_last_ns = arrival
                for ev, c in batch:
                    kind = c.kind
                    if kind is Kind.OTHER and c.obj is None and ev.data and ev.data.strip():
                        # Data that is not JSON (cut short, garbage): clients would choke on
                        # it, so the stream ends here with the protocol's error event. The
                        # data itself is not quoted: it may be answer content.
                        raise UpstreamError(502, "upstream sent a malformed event (its data "
                                                 "is not JSON): the answer is cut there")
                    if kind is Kind.OTHER and ev.data is None and not ev.raw.startswith(b":"):
                        # No data: not an event of any of these protocols (a bare `id:` or
                        # `retry:`, junk); the openai SDK would choke on it. Comments (upstream
                        # keep-alives) still pass.
                        continue
                    self._note(c)
                    if held_error is not None:  # more followed the error: pass it on, in order
                        (hold if hold is not None else self._out).append(held_error)
                        held_error = None
                    if kind is Kind.TERMINAL:
                        terminal = (ev, c)
                        break
                    if kind is Kind.CONTENT:
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
                    elif kind is Kind.ERROR:
                        held_error = self._scrub().raw(adapter.restamp(ev, c))
                    elif hold is not None:
                        hold.append(adapter.restamp(ev, c))
                    else:
                        # Structure, tool-call deltas, unknown events: on arrival, in order.
                        self._out.append(adapter.restamp(ev, c))
                if self._out and not src.ready():
                    await self._flush()
        except UpstreamError as exc:
            rec.status = "upstream_error"
            rec.error = self._scrub().text(exc.message)
            code = "upstream_timeout" if exc.status == 504 else "upstream_error"
            tail = adapter.error_event(rec.error, "server_error", code)
        finally:
            if terminal is not None:
                await src.drain()
            await src.close()
        if held_error is not None:
            if tail:  # the connection broke after the error: both go out, in order
                (hold if hold is not None else self._out).append(held_error)
            else:
                tail = held_error
        if terminal is None and not tail and rec.status == "ok":
            # The upstream ended cleanly but early (a close-delimited body cut, a chunked body
            # ended before [DONE] / message_stop / response.completed): not a complete answer.
            rec.status = "upstream_error"
            rec.error = "upstream ended the stream without its final event"
            tail = adapter.error_event(rec.error, "server_error", "upstream_error")
        if hold is not None and pacer is not None:
            _, completion = adapter.usage_counts(rec.usage)
            due = pacer.due_all(completion if completion is not None else hold_tokens)
            await self._wait(due, RELEASE_SPIN_NS)
            self._out.extend(hold)
            self._pend_texts, self._pend_tokens = hold_texts, hold_tokens
            self._pend_output, self._pend_min, self._pend_max = True, due, due
        if self._out:
            await self._flush()
        if terminal is not None and not tail:
            tail = adapter.restamp(*terminal)
            if terminal[1].error is not None:  # response.failed quotes the upstream's error
                tail = self._scrub().raw(tail)
        return tail

    async def _finish_stream(self, tail: bytes) -> None:
        """Record the cycle, then send the final frame (an error event if the write fails)."""
        rec = self.rec
        self.finalizing = True
        rec.t_done_ns = _now()
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - the final event must not go out unrecorded
            self.state.errors += 1
            await self._emit_last(self.adapter.error_event(
                "flowtrial could not record this request, so the stream is ended without its "
                "final event: check the proxy's database", "server_error", "recording_failed"))
            return
        if rec.status != "ok":
            self.state.errors += 1
        await self._emit_last(tail)
