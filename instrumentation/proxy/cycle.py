"""One cycle's shaped relay, independent of the transport it is delivered over.

:class:`Cycle` holds what every proxied model answer shares: the cycle record, the arm
resolution (the only database reads, all before the upstream call), the pacer, and the relay
of a stream of classified upstream events to the client. It is assembled from parts given to
it: the transport's sink (:class:`~flowtrial.instrumentation.proxy.delivery.Transport`: HTTP +
SSE body chunks from :class:`~flowtrial.instrumentation.proxy.relay.Exchange`, one text frame
per event from the Responses WebSocket mode's
:class:`~flowtrial.instrumentation.proxy.websocket.SocketTurn`), the record sink
(:class:`~flowtrial.instrumentation.proxy.recorder.Recorder`) and, once the arm is known, a
delivery strategy (:mod:`~flowtrial.instrumentation.proxy.delivery`: unshaped, paced, held
whole) that decides when text leaves. The final frame goes out only once the row is durable.

Shaping rules (docs/concepts/shaping.md): model output — answer text and tool-call events —
is released on the schedule; the TTFT floor holds the first output event, text or tool call.
Text is split into token-sized whole events when there is a pace to keep; a tool-call /
function-call event is never re-split: it leaves whole once its last argument token is due
(tool calls are also counted in ``tool_calls``). Everything else (structure, usage, unknown
event types) goes out on arrival, in order; ``all_at_once`` holds everything from the first
output on.

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

from .auth import ParticipantInfo
from .delivery import Delivery, Output, Transport, delivery_for
from .hooks import count_error
from .protocols.base import Classified, Kind, ProtocolAdapter, RequestInfo
from .recorder import CycleRecord, Recorder
from .scrub import Scrubber
from .shaping import Pacer
from .sources import Direct
from .state import ProxyState, new_cycle_id
from .upstream import UpstreamError

__all__ = ["Cycle"]

log = logging.getLogger("flowtrial.proxy")
_now = time.monotonic_ns


class Cycle:
    """One proxied answer: its record, arm, relay and recording (the transport and the
    record sink are given to it)."""

    def __init__(self, state: ProxyState, adapter: ProtocolAdapter, participant: ParticipantInfo,
                 info: RequestInfo, t_request_ns: int, *, transport: Transport,
                 recorder: Recorder, transport_name: str = "http", turn: int = 1,
                 connection_id: str | None = None) -> None:
        self.state = state
        self.adapter = adapter
        self.info = info
        self.transport = transport
        self.recorder = recorder
        self.rec = CycleRecord(
            id=new_cycle_id(), participant_id=participant.id, protocol=adapter.name,
            stream=info.stream, model=info.model, upstream="", arm="", t_request_ns=t_request_ns,
            mono_anchor_ns=state.mono_anchor_ns, wall_anchor_ns=state.wall_anchor_ns,
            started_at=datetime.fromtimestamp(
                (state.wall_anchor_ns + t_request_ns - state.mono_anchor_ns) / 1e9, UTC),
            simulated=participant.simulated, prompt_text=info.prompt_text,
            transport=transport_name, turn=turn, connection_id=connection_id,
        )
        self.out = Output(transport, self.rec, state.keepalive_ns)
        self.pacer: Pacer | None = None
        self._task_lookup: asyncio.Future[int | None] | None = None
        self.finalizing = False  # the row is being made durable: a disconnect no longer cancels
        self._scrubber: Scrubber | None = None

    @property
    def id(self) -> str:
        return self.rec.id

    def scrub(self) -> Scrubber:
        """Redacts keys from upstream-derived error text; built on first use, so only error
        paths read the key variables."""
        if self._scrubber is None:
            self._scrubber = Scrubber.for_request(self.state.config,
                                                  self.transport.client_key())
        return self._scrubber

    # ------------------------------------------------------------------ arm and record
    async def resolve(self) -> None:
        """Resolve the arm and set up the pacer (raises NoAssignmentError)."""
        rec = self.rec
        res = await self.state.arms.resolve(rec.participant_id)
        rec.arm, rec.target, rec.period = res.arm, res.target, res.period
        rec.task_id, rec.draw_json = res.task_id, res.draw_json
        self._task_lookup = res.task_lookup
        if res.target is not None:
            self.pacer = Pacer(res.target, rec.t_request_ns, seed=rec.id)

    async def record(self) -> None:
        """Make the cycle durable (raises if the write fails); nothing is written for a
        participant who withdrew while it ran (their data may already be deleted)."""
        if self.state.auth.withdrawn(self.rec.participant_id):
            return
        if self._task_lookup is not None:
            try:
                self.rec.task_id = await asyncio.shield(self._task_lookup)
            except Exception:  # noqa: BLE001 - a label only; the cycle must still be recorded
                log.warning("task lookup failed for cycle %s", self.rec.id, exc_info=True)
            self._task_lookup = None
        if self.rec.error:  # the last stop before cycles.error: no key gets past it
            self.rec.error = self.scrub().text(self.rec.error)
        # The turn's row (if this cycle opened or extended one) commits with the cycle's.
        await self.recorder.record(self.rec, self.state.turns.recorded(self.rec))

    async def abandon(self, why: str, status: str = "abandoned", started: bool = True) -> bool:
        """Record the cycle as ended early; whether its row is durable."""
        rec = self.rec
        self.finalizing = True
        rec.status = status
        rec.error = why
        rec.http_status = rec.http_status or (200 if started else 499)
        rec.t_done_ns = _now()
        try:
            await self.record()
        except Exception:  # noqa: BLE001 - nobody is left to tell; the counter shows it
            count_error(self.state)
            return False
        return True

    # ------------------------------------------------------------------ the stream
    def _admit(self, ev: Any, c: Classified) -> bool:
        """Whether an upstream event is relayed at all (raises on one that breaks the
        stream)."""
        if c.kind is not Kind.OTHER:
            return True
        if c.obj is None and ev.data and ev.data.strip():
            # Data that is not JSON (cut short, garbage): clients would choke on it, so the
            # stream ends here with the protocol's error event. The data itself is not
            # quoted: it may be answer content.
            raise UpstreamError(502, "upstream sent a malformed event (its data is not JSON): "
                                     "the answer is cut there")
        # No data: not an event of any of these protocols (a bare `id:` or `retry:`, junk);
        # the openai SDK would choke on it. Comments (upstream keep-alives) still pass.
        return ev.data is not None or ev.raw.startswith(b":")

    def _note(self, c: Classified) -> None:
        """Take what the record keeps from an event (usage, ids, tool calls, errors)."""
        rec = self.rec
        if c.usage is not None:
            rec.usage = c.usage
        if c.response_id and rec.upstream_response_id is None:
            rec.upstream_response_id = c.response_id
        rec.tool_calls += c.tool_calls
        if c.error is not None:
            rec.status = "upstream_error"
            rec.error = self.scrub().text(c.error)[:1000]  # redact before cutting

    def _broken(self, exc: UpstreamError) -> bytes:
        """The stream broke: record why; the protocol's error event ends it."""
        rec = self.rec
        rec.status = "upstream_error"
        rec.error = self.scrub().text(exc.message)
        return self.adapter.error_event(rec.error, "server_error", exc.code("upstream_error"))

    def _cut_short(self) -> bytes:
        """The upstream ended cleanly but early (a close-delimited body cut, a chunked body
        ended before [DONE] / message_stop / response.completed): not a complete answer."""
        rec = self.rec
        rec.status = "upstream_error"
        rec.error = "upstream ended the stream without its final event"
        return self.adapter.error_event(rec.error, "server_error", "upstream_error")

    def _final_frame(self, terminal: tuple[Any, Classified]) -> bytes:
        tail = self.adapter.restamp(*terminal)
        if terminal[1].error is not None:  # response.failed quotes the upstream's error
            tail = self.scrub().raw(tail)
        return tail

    async def relay(self, src: Direct) -> bytes:
        """Relay ``src`` up to its final event; returns the final frame to send once the row
        is durable (the terminal event, an error event, or b"" when the stream just ended)."""
        adapter, out, rec = self.adapter, self.out, self.rec
        delivery: Delivery = delivery_for(self.pacer, out, adapter)
        # Bound once: these run per event.
        admit, note, other = self._admit, self._note, delivery.other
        content, tool = delivery.content, delivery.tool
        terminal: tuple[Any, Classified] | None = None
        tail = b""
        # The upstream's error event, held back: if nothing follows it, it is the stream's
        # final event and goes out only once the row is durable.
        held_error: bytes | None = None
        try:
            while terminal is None:
                got = await src.get()
                if got is None:
                    break
                arrival, batch = got
                rec.t_upstream_last_ns = arrival
                for ev, c in batch:
                    if not admit(ev, c):
                        continue
                    note(c)
                    if held_error is not None:  # more followed the error: pass it on, in order
                        other(held_error)
                        held_error = None
                    kind = c.kind
                    if kind is Kind.TERMINAL:
                        terminal = (ev, c)
                        break
                    if kind is Kind.CONTENT:
                        if rec.t_upstream_first_output_ns is None:
                            rec.t_upstream_first_output_ns = arrival
                        await content(ev, c, arrival)
                    elif kind is Kind.TOOL:
                        if rec.t_upstream_first_output_ns is None:
                            rec.t_upstream_first_output_ns = arrival
                        await tool(ev, c, arrival)
                    elif kind is Kind.ERROR:
                        held_error = self.scrub().raw(adapter.restamp(ev, c))
                    else:
                        # Structure, unknown events: on arrival, in order.
                        other(adapter.restamp(ev, c))
                if out.frames and not src.ready():
                    await delivery.pause()
        except UpstreamError as exc:
            tail = self._broken(exc)
        finally:
            if terminal is not None:
                await src.drain()
            await src.close()
        if held_error is not None:
            if tail:  # the connection broke after the error: both go out, in order
                delivery.other(held_error)
            else:
                tail = held_error
        if (terminal is None and not tail and self.rec.status == "ok"
                and not adapter.complete_at_eof()):
            tail = self._cut_short()
        await delivery.finish()
        if out.frames:
            await out.flush()
        if terminal is not None and not tail:
            tail = self._final_frame(terminal)
        return tail

    async def finish_stream(self, tail: bytes) -> None:
        """Record the cycle, then send the final frame (an error event if the write fails)."""
        rec = self.rec
        self.finalizing = True
        rec.t_done_ns = _now()
        try:
            await self.record()
        except Exception:  # noqa: BLE001 - the final event must not go out unrecorded
            count_error(self.state)
            await self.transport.emit_last(self.adapter.error_event(
                "flowtrial could not record this request, so the stream is ended without its "
                "final event: check the proxy's database", "server_error", "recording_failed"))
            return
        if rec.status != "ok":
            count_error(self.state)
        await self.transport.emit_last(tail)
