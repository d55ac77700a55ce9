"""Where a stream's upstream events come from: parsed and classified, batch by batch.

:class:`Direct` reads the upstream as the relay asks (unshaped streams: nothing is held, so
no extra task). :class:`Prefetch` reads eagerly in its own task while the shaper holds events
back, so a fast upstream is never throttled by TCP backpressure and arrival times are true.
Both stamp ``t_upstream_first_ns`` on the cycle when the first body bytes arrive. The parser
cuts the body into events: :class:`SSEParser` for HTTP streams, :class:`JsonFrames` for the
WebSocket mode (every chunk is one JSON message).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from itertools import islice
from typing import Any

from .protocols.base import (
    Classified,
    JsonFrames,
    ProtocolAdapter,
    SSEParser,
)
from .recorder import CycleRecord
from .runtime_tuning import give_way
from .upstream import UpstreamError

__all__ = ["Direct", "Prefetch"]

_now = time.monotonic_ns
_EOF = object()
_NONE = object()
_SLICE = 16  # events a prefetched chunk is classified by, a slice per loop turn (~0.2 ms)


class Direct:
    """Upstream events as they are read (unshaped: nothing to wait for, no extra task)."""

    def __init__(self, body: AsyncIterator[bytes], adapter: ProtocolAdapter, rec: CycleRecord,
                 parser: SSEParser | JsonFrames):
        self._it = body.__aiter__()
        self._parser = parser
        self._classify = adapter.classify
        self._rec = rec
        self._done = False

    async def drain(self, timeout_s: float = 0.2) -> None:
        """Read what follows the final event (the chunked terminator), so the upstream
        connection goes back to the pool instead of being closed; give up after a moment."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.get() is not None:
                    pass
        except (TimeoutError, UpstreamError):
            pass

    async def _raw(self) -> tuple[int, list[Any]] | None:
        """The next chunk's events, parsed but not yet classified, with their arrival time."""
        while not self._done:
            try:
                chunk = await self._it.__anext__()
            except StopAsyncIteration:
                self._done = True
                evs = self._parser.flush()
                return (_now(), evs) if evs else None
            t = _now()
            if self._rec.t_upstream_first_ns is None:
                self._rec.t_upstream_first_ns = t
            evs = self._parser.feed(chunk)
            if evs:
                return t, evs
        return None

    async def get(self) -> tuple[int, list[tuple[Any, Classified]]] | None:
        got = await self._raw()
        if got is None:
            return None
        t, evs = got
        return t, [(e, self._classify(e)) for e in evs]

    def ready(self) -> bool:
        return False

    async def close(self) -> None:
        pass


class Prefetch(Direct):
    """Reads the upstream eagerly in its own task while the shaper holds events back, so a
    fast upstream is never throttled by TCP backpressure and arrival times are true.

    Chunks wait in the queue as bytes and are cut into events and classified a slice at a
    time as the shaper takes them. A whole answer can arrive in one read: making and decoding
    its hundreds of events at once would hold up other streams' due tokens for milliseconds,
    and keeping them all alive as objects makes every young-generation garbage collection
    walk them (3-6 ms pauses at 100 streams).
    """

    def __init__(self, body: AsyncIterator[bytes], adapter: ProtocolAdapter, rec: CycleRecord,
                 parser: SSEParser | JsonFrames):
        super().__init__(body, adapter, rec, parser)
        self._q: asyncio.Queue[Any] = asyncio.Queue()
        self._events: Iterator[Any] | None = None  # the current chunk's events, lazily
        self._ahead: Any = _NONE  # one event taken from them, to know if more remain
        self._t = 0
        self._eof = False
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                try:
                    chunk = await self._it.__anext__()
                except StopAsyncIteration:
                    break
                t = _now()
                if self._rec.t_upstream_first_ns is None:
                    self._rec.t_upstream_first_ns = t
                self._q.put_nowait((t, chunk))
            self._q.put_nowait(_EOF)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer in order
            self._q.put_nowait(exc)

    def _take(self) -> list[Any]:
        """Up to a slice of the current chunk's events (keeping one ahead)."""
        assert self._events is not None
        evs = [] if self._ahead is _NONE else [self._ahead]
        evs.extend(islice(self._events, _SLICE - len(evs)))
        self._ahead = next(self._events, _NONE)
        if self._ahead is _NONE:
            self._events = None
        return evs

    async def get(self) -> tuple[int, list[tuple[Any, Classified]]] | None:
        if self._events is not None:
            # Between slices of one chunk: let other streams run, and a first token due
            # now go out before this slice is made.
            await asyncio.sleep(0)
            await give_way()
        while self._events is None:
            if self._eof:
                return None
            item = await self._q.get()
            if item is _EOF:
                self._eof = True
                evs = self._parser.flush()
                return (_now(), [(e, self._classify(e)) for e in evs]) if evs else None
            if isinstance(item, Exception):
                raise item
            self._t, chunk = item
            self._events = self._parser.iter_feed(chunk)
            self._ahead = next(self._events, _NONE)
            if self._ahead is _NONE:
                self._events = None  # a chunk that completed no event
        return self._t, [(e, self._classify(e)) for e in self._take()]

    def ready(self) -> bool:
        return self._events is not None or not self._q.empty()

    async def close(self) -> None:
        # Wait for the reader to stop: the upstream body must not be closed while it runs.
        self._task.cancel()
        try:
            await self._task
        except BaseException:  # noqa: BLE001 - its outcome was already delivered or is moot
            pass
