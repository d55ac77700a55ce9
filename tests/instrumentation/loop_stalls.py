"""How long the running event loop is held up while some work runs: a 2 ms ticker's lateness
(used by the tests of work kept off the proxy's loop and by
``benchmarks/bench_socket_messages.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stalls:
    """The ticker's latenesses (s) while the work ran, and the work's wall time (s)."""

    late: list[float]
    took: float

    @property
    def longest(self) -> float:
        return max(self.late)


async def stalls_during(work: Callable[[], Awaitable[object]], tick_s: float = 0.002
                        ) -> Stalls:
    """Run ``work`` on this loop beside a ticker that sleeps ``tick_s`` at a time."""
    late: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(tick_s)
            late.append(time.perf_counter() - t - tick_s)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    await work()
    took = time.perf_counter() - t0
    done.set()
    await ticker
    return Stalls(late, took)
