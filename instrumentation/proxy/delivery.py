"""How a cycle's output reaches the client: the output buffer and the delivery strategies.

:class:`Output` holds the frames waiting to go out and what they carry, writes them through
the cycle's :class:`Transport` (HTTP + SSE body chunks, or Responses WebSocket frames) and
accounts each write on the cycle record (``sent``, ``tokens_sent``, content). It also waits
for a deadline, keeping the connection alive meanwhile when the transport needs it.

A :class:`Delivery` strategy decides *when* model output leaves: answer text
(:meth:`Delivery.content`) and tool-call events (:meth:`Delivery.tool`: a call's start, or
its argument text, never re-split since agents rely on deltas arriving intact); everything
else (structure, unknown events) is handed to :meth:`Delivery.other` and leaves in order:

- :class:`Unshaped` (no target for the arm): output goes out as it arrives;
- :class:`Paced` (a TTFT floor and/or a pace): output is released on the
  :class:`~flowtrial.instrumentation.proxy.shaping.Pacer`'s schedule. The floor holds the
  first output event, text or tool call; text is split into token-sized whole events when
  there is a pace to keep; a tool-call event leaves whole when its last argument token is
  due (an arm is a model speed: it writes arguments at the same pace as text);
- :class:`HeldWhole` (``all_at_once``): everything from the first output on is held and
  released together at t_request + ttft + n/tps.

The record's output timeline (experienced TTFT, generation wait, achieved tps,
``tokens_sent``, ``violation_ms``) is that of text *and* tool-call arguments; the recorded
content is the answer text only.

- :class:`Framed` (a pace faster than one token per display frame, ``frame_ms``): as
  :class:`Paced`, but the tokens due within one frame leave together in one write.

:func:`delivery_for` picks the strategy for a pacer; a new one is a new subclass and one line
there.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..tokens import count_tokens, split_tokens
from .protocols.base import Classified, ProtocolAdapter
from .recorder import CycleRecord
from .shaping import RELEASE_SPIN_NS, Pacer, sleep_until

__all__ = ["Delivery", "Framed", "HeldWhole", "Output", "Paced", "Transport", "Unshaped",
           "delivery_for"]

_now = time.monotonic_ns


class Transport(Protocol):
    """Where a cycle's output frames go (the sink a transport gives the cycle)."""

    #: Whether injected waits need keep-alive bytes (SSE: yes; WebSocket: no, the server's
    #: own ping frames keep the socket alive).
    keepalive_frames: bool

    async def emit(self, frames: list[bytes]) -> None:
        """Send output frames, in order."""

    async def emit_keepalive(self) -> None:
        """Keep the connection alive during an injected wait."""

    async def emit_last(self, frame: bytes) -> None:
        """Send the final frame (possibly empty) and end the answer."""

    def client_key(self) -> str | list[str] | None:
        """The participant's key(s) as their client sent them (redacted from error text)."""


class Output:
    """Frames waiting to go out, written through the transport and accounted on the record."""

    def __init__(self, transport: Transport, rec: CycleRecord, keepalive_ns: int) -> None:
        self.transport = transport
        self.rec = rec
        self.keepalive_ns = keepalive_ns
        self.last_write = rec.t_request_ns
        self.frames: list[bytes] = []
        self._texts: list[str] = []
        self._tokens = 0
        self._output = False  # the pending frames carry answer text
        self._min: int | None = None
        self._max: int | None = None

    def push(self, raw: bytes, text: str | None, ntok: int, due: int | None) -> None:
        """Queue an output frame carrying ``ntok`` tokens (``due``: its scheduled release, None
        when unshaped); ``text`` is answer text for the record's content (None for a tool
        call: its argument tokens count, its arguments are not answer text)."""
        self.frames.append(raw)
        if text is not None:
            self._texts.append(text)
        self._tokens += ntok
        self._output = True
        if due is not None:
            if self._min is None:
                self._min = due
            self._max = due  # dues only grow within a stream

    def push_held(self, frames: list[bytes], texts: list[str], tokens: int, due: int) -> None:
        """Queue a held answer released whole at ``due``."""
        self.frames.extend(frames)
        self._texts, self._tokens = texts, tokens
        self._output, self._min, self._max = True, due, due

    async def flush(self) -> None:
        frames = self.frames
        self.frames = []
        await self.transport.emit(frames)
        now = _now()
        self.last_write = now
        if self._output:
            rec = self.rec
            rec.sent(now, self._min, self._max)
            rec.tokens_sent = (rec.tokens_sent or 0) + self._tokens
            rec.content_parts.extend(self._texts)
            self._texts = []
            self._tokens = 0
            self._output = False
            self._min = self._max = None

    async def wait(self, due: int, spin_ns: int = 0, flush: bool = True) -> None:
        """Flush what is pending (unless ``flush`` is false: it leaves after the wait), then
        wait for ``due``, keeping the stream alive."""
        if flush and self.frames:
            await self.flush()
        if not self.transport.keepalive_frames:
            await sleep_until(due, spin_ns)
            return
        ka = self.keepalive_ns
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
            await self.transport.emit_keepalive()
            self.last_write = _now()


class Delivery:
    """When output events leave (subclasses); other events pass on arrival, in order."""

    def __init__(self, out: Output, adapter: ProtocolAdapter) -> None:
        self.out = out
        self.adapter = adapter

    async def content(self, ev: Any, c: Classified, arrival: int) -> None:
        """A text event that arrived at ``arrival`` (monotonic ns)."""
        raise NotImplementedError

    async def tool(self, ev: Any, c: Classified, arrival: int) -> None:
        """A tool-call event (a call's start, or arguments in ``c.text``): never re-split."""
        self.other(self.adapter.restamp(ev, c))

    def other(self, raw: bytes) -> None:
        """A frame that is not model output (structure, a passed-on error)."""
        self.out.frames.append(raw)

    async def pause(self) -> None:
        """The source has nothing more ready: send what may go out now."""
        if self.out.frames:
            await self.out.flush()

    async def finish(self) -> None:
        """The stream has ended: release whatever the strategy still holds."""


def tool_tokens(c: Classified) -> int:
    """Output tokens a tool-call event carries: its argument text (the call's name and
    structure are not counted, as no protocol reports them apart)."""
    return count_tokens(c.text) if c.text else 0


class Unshaped(Delivery):
    """No target: output goes out as it arrives."""

    async def content(self, ev: Any, c: Classified, arrival: int) -> None:
        n = count_tokens(c.text) if c.text else 0
        self.out.push(self.adapter.restamp(ev, c), c.text, n, None)

    async def tool(self, ev: Any, c: Classified, arrival: int) -> None:
        # On arrival as before, but on the output timeline (TTFT, wait, tokens_sent).
        self.out.push(self.adapter.restamp(ev, c), None, tool_tokens(c), None)


class Paced(Delivery):
    """Output on the pacer's schedule: the TTFT floor holds the first output event (text or
    tool call), then the pace. Text is split into token-sized whole events when there is a
    pace to keep; a tool-call event is never split: it leaves whole when its last argument
    token is due."""

    def __init__(self, out: Output, adapter: ProtocolAdapter, pacer: Pacer) -> None:
        super().__init__(out, adapter)
        self.pacer = pacer
        self.k = 0  # tokens released so far
        out.rec.frame_ms = pacer.frame_ns / 1e6  # the granularity used: 0 = per token

    async def content(self, ev: Any, c: Classified, arrival: int) -> None:
        text = c.text
        pieces = split_tokens(text) if text else []
        n = len(pieces)
        if n > 1 and self.pacer.splits and c.text_key is not None:
            for raw, piece in zip(self.adapter.split(ev, c, pieces), pieces, strict=True):
                await self._release(raw, piece, 1, arrival)
        else:
            await self._release(self.adapter.restamp(ev, c), text, n, arrival)

    async def tool(self, ev: Any, c: Classified, arrival: int) -> None:
        await self._release(self.adapter.restamp(ev, c), None, tool_tokens(c), arrival,
                            whole=True)

    async def _release(self, raw: bytes, text: str | None, width: int, arrival: int,
                       whole: bool = False) -> None:
        """Send one event carrying ``width`` tokens when its last token is due (``whole``: a
        first event that must not be split waits for its last token too; text's first event
        goes at the floor, as it always has)."""
        out, pacer, k = self.out, self.pacer, self.k
        if k == 0 and pacer.base is None:
            # The first output: a precise release at the TTFT floor.
            lead = pacer.offset(width - 1) if whole and width > 1 else 0
            due = pacer.first_due(arrival) + lead
            if due > _now():
                await out.wait(due, RELEASE_SPIN_NS)
            out.push(raw, text, width, due)
            pacer.start(_now() - lead)
            # Out now: the source's next slice (or the next event) could yield first.
            await out.flush()
        elif width == 0:
            out.push(raw, text, 0, None)  # a call's start mid-answer: right after what is due
        else:
            await self._paced(raw, text, width, pacer.due(k + width - 1))
        self.k = k + width

    async def _paced(self, raw: bytes, text: str | None, width: int, due: int) -> None:
        """A later event, due at ``due`` (per event here; per display frame in subclasses)."""
        if due > _now():
            await self.out.wait(due)
        self.out.push(raw, text, width, due)


class Framed(Paced):
    """Fast arms: tokens due within one display frame leave together, in one write.

    A frame opens at the due time of its first token and holds the tokens due within
    ``frame_ns`` of it; it goes out when its last token is due (so no token leaves early,
    and the answer's last token leaves on time), on absolute deadlines (``pacer.due(k)``),
    so no error accumulates: one timer and one write per frame instead of per token. Each
    upstream event stays its own protocol event (events are never merged); a text event is
    split only where it spans frames. Token 0 is still a precise release at the TTFT floor;
    tool-call events are never split, as in :class:`Paced`.
    """

    def __init__(self, out: Output, adapter: ProtocolAdapter, pacer: Pacer) -> None:
        super().__init__(out, adapter, pacer)
        self.frame_ns = pacer.frame_ns
        self.frame_end: int | None = None  # the open frame holds tokens due before this
        self.release_at = 0  # when the open frame goes out: the due of its last token

    async def content(self, ev: Any, c: Classified, arrival: int) -> None:
        parts, widths = self._frame_parts(c)
        if len(parts) > 1:
            for raw, part, w in zip(self.adapter.split(ev, c, parts), parts, widths,
                                    strict=True):
                await self._release(raw, part, w, arrival)
        else:
            await self._release(self.adapter.restamp(ev, c), c.text, widths[0], arrival)

    def _frame_parts(self, c: Classified) -> tuple[list[str], list[int]]:
        """The event's text cut where it spans frames, and each part's token count. (The
        token pieces die here: a long answer's thousands of small strings would otherwise
        stay alive while it is paced, for every older-generation collection to walk.)"""
        text = c.text
        pieces = split_tokens(text) if text else []
        n = len(pieces)
        if n > 1 and c.text_key is not None:
            widths = self._frame_widths(n)
            if len(widths) > 1:
                parts, i = [], 0
                for w in widths:
                    parts.append("".join(pieces[i:i + w]))
                    i += w
                return parts, widths
        return [text], [n]

    def _frame_widths(self, n: int) -> list[int]:
        """How many of an event's ``n`` tokens fall in each frame they span (token 0 alone:
        its release is the precise one)."""
        pacer, k = self.pacer, self.k
        offset = pacer.offset
        widths: list[int] = []
        end = None if self.frame_end is None or pacer.base is None else (
            self.frame_end - pacer.base)
        i = 0
        if k == 0 and pacer.base is None:
            widths.append(1)
            i = 1
        for j in range(i, n):
            off = offset(k + j)
            if end is None or off >= end:  # opens a frame
                widths.append(1)
                end = off + self.frame_ns
            elif widths:
                widths[-1] += 1
            else:  # the event's first part, in the frame already open
                widths.append(1)
        return widths

    async def _paced(self, raw: bytes, text: str | None, width: int, due: int) -> None:
        first = self.pacer.due(self.k)
        if self.frame_end is not None and first >= self.frame_end:
            await self._send_frame()
        if self.frame_end is None:
            self.frame_end = first + self.frame_ns
        self.out.push(raw, text, width, due)
        self.release_at = due

    async def _send_frame(self) -> None:
        """The open frame goes out once its last token is due."""
        if self.release_at > _now():
            await self.out.wait(self.release_at, flush=False)
        self.frame_end = None
        await self.out.flush()

    async def pause(self) -> None:
        if self.frame_end is not None:
            await self._send_frame()
        elif self.out.frames:
            await self.out.flush()

    async def finish(self) -> None:
        if self.frame_end is not None:
            await self._send_frame()


class HeldWhole(Delivery):
    """``all_at_once``: everything from the first output (text or tool call) on is held, then
    released together once the whole answer is due (its completion tokens at the arm's
    pace)."""

    def __init__(self, out: Output, adapter: ProtocolAdapter, pacer: Pacer) -> None:
        super().__init__(out, adapter)
        self.pacer = pacer
        self.hold: list[bytes] | None = None
        self.texts: list[str] = []
        self.tokens = 0

    async def content(self, ev: Any, c: Classified, arrival: int) -> None:
        if self.hold is None:
            self.hold = []
        self.hold.append(self.adapter.restamp(ev, c))
        self.texts.append(c.text)
        self.tokens += count_tokens(c.text) if c.text else 0

    async def tool(self, ev: Any, c: Classified, arrival: int) -> None:
        if self.hold is None:
            self.hold = []
        self.hold.append(self.adapter.restamp(ev, c))
        self.tokens += tool_tokens(c)

    def other(self, raw: bytes) -> None:
        if self.hold is not None:
            self.hold.append(raw)
        else:
            self.out.frames.append(raw)

    async def finish(self) -> None:
        if self.hold is None:
            return
        _, completion = self.adapter.usage_counts(self.out.rec.usage)
        due = self.pacer.due_all(completion if completion is not None else self.tokens)
        await self.out.wait(due, RELEASE_SPIN_NS)
        self.out.push_held(self.hold, self.texts, self.tokens, due)


def delivery_for(pacer: Pacer | None, out: Output, adapter: ProtocolAdapter) -> Delivery:
    """The strategy for a cycle's arm (its pacer; None: unshaped)."""
    if pacer is None:
        return Unshaped(out, adapter)
    if pacer.all_at_once:
        return HeldWhole(out, adapter, pacer)
    if pacer.frame_ns:
        return Framed(out, adapter, pacer)
    return Paced(out, adapter, pacer)
