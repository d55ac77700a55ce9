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
from collections.abc import AsyncIterator
from typing import Any

from instrumentation.proxy.protocols.base import (
    Classified,
    JsonFrames,
    ProtocolAdapter,
    SSEParser,
)
from instrumentation.proxy.recorder import CycleRecord
from instrumentation.proxy.upstream import UpstreamError

__all__ = ["Direct", "Prefetch"]

_now = time.monotonic_ns
_EOF = object()


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

    async def get(self) -> tuple[int, list[tuple[Any, Classified]]] | None:
        while not self._done:
            try:
                chunk = await self._it.__anext__()
            except StopAsyncIteration:
                self._done = True
                evs = self._parser.flush()
                if evs:
                    return _now(), [(e, self._classify(e)) for e in evs]
                return None
            t = _now()
            if self._rec.t_upstream_first_ns is None:
                self._rec.t_upstream_first_ns = t
            evs = self._parser.feed(chunk)
            if evs:
                return t, [(e, self._classify(e)) for e in evs]
        return None

    def ready(self) -> bool:
        return False

    async def close(self) -> None:
        pass


class Prefetch(Direct):
    """Reads the upstream eagerly in its own task while the shaper holds events back, so a
    fast upstream is never throttled by TCP backpressure and arrival times are true."""

    def __init__(self, body: AsyncIterator[bytes], adapter: ProtocolAdapter, rec: CycleRecord,
                 parser: SSEParser | JsonFrames):
        super().__init__(body, adapter, rec, parser)
        self._q: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (got := await Direct.get(self)) is not None:
                self._q.put_nowait(got)
            self._q.put_nowait(_EOF)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer in order
            self._q.put_nowait(exc)

    async def get(self) -> tuple[int, list[tuple[Any, Classified]]] | None:
        item = await self._q.get()
        if item is _EOF:
            self._q.put_nowait(_EOF)
            return None
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]

    def ready(self) -> bool:
        return not self._q.empty()

    async def close(self) -> None:
        # Wait for the reader to stop: the upstream body must not be closed while it runs.
        self._task.cancel()
        try:
            await self._task
        except BaseException:  # noqa: BLE001 - its outcome was already delivered or is moot
            pass
