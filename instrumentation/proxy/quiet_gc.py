"""Run the garbage collector's older generations when no timed release is due soon.

CPython collects generation 1 after every 10 young collections, wherever the event loop
happens to be. With ~100 open shaped streams generation 1 holds tens of thousands of live
objects (each stream's coroutines, buffers, parsed events), so that collection stalls the loop
for 2–7 ms; landing just before a first token's release it shows up as a TTFT miss
(benchmarks/bench_proxy_shaping_protocols.py).

The shaper announces when its precise releases are due
(:mod:`~flowtrial.instrumentation.proxy.releases`), so the proxy takes the older generations off the
automatic schedule and runs them from a task at moments when no release is due within a
guard larger than a collection lasts. Young collections (generation 0) stay automatic: they
are cheap. A collection that has waited ``max_defer`` times its usual cadence runs anyway,
so memory stays bounded even when releases never leave a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time

from .releases import soonest_release

__all__ = ["QuietCollector"]

log = logging.getLogger(__name__)

_monotonic_ns = time.monotonic_ns


class QuietCollector:
    """Runs generation 1 and 2 collections between timed releases (one per app lifespan).

    ``check_s``: how often the task looks; ``min_guard_ms``: the least gap before the next
    release a collection needs (it grows to three times the slowest recent collection);
    ``max_defer``: after this many times CPython's own cadence, collect regardless.
    """

    # Process-wide: several apps in one process (tests) share the collector's thresholds.
    _lock = threading.Lock()
    _users = 0
    _saved: tuple[int, int, int] | None = None

    def __init__(self, check_s: float = 0.01, min_guard_ms: float = 4.0,
                 max_defer: int = 10) -> None:
        self.check_s = check_s
        self.min_guard_ns = int(min_guard_ms * 1e6)
        self.max_defer = max_defer
        self.collections = [0, 0, 0]  # run by this collector, per generation
        self.forced = 0  # of those, run with a release due inside the guard
        self.slowest_ns = [0, 0, 0]
        self._cost_ns = [0, 0, 0]  # recent cost per generation (decaying maximum)
        self._task: asyncio.Task[None] | None = None
        self._t1 = self._t2 = 10
        self._gen1_runs = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Take generations 1 and 2 off the automatic schedule and start the task."""
        with QuietCollector._lock:
            if QuietCollector._users == 0:
                QuietCollector._saved = gc.get_threshold()
                t0, _t1, _t2 = QuietCollector._saved
                # Generation 1 is collected when the count of young collections exceeds the
                # second threshold: an unreachable one takes it (and generation 2) off.
                gc.set_threshold(t0, 1 << 30, 1 << 30)
            QuietCollector._users += 1
            saved = QuietCollector._saved
        assert saved is not None
        self._t1 = max(1, saved[1])
        self._t2 = max(1, saved[2])
        self._task = asyncio.get_running_loop().create_task(self._run(), name="quiet-gc")

    async def stop(self) -> None:
        """Stop the task; the last collector out restores CPython's own schedule."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with QuietCollector._lock:
            QuietCollector._users -= 1
            if QuietCollector._users == 0 and QuietCollector._saved is not None:
                gc.set_threshold(*QuietCollector._saved)
                QuietCollector._saved = None

    def snapshot(self) -> dict[str, int | float]:
        """What the collector has done, for the health endpoint."""
        return {"collections_gen1": self.collections[1], "collections_gen2": self.collections[2],
                "forced": self.forced,
                "slowest_ms_gen1": round(self.slowest_ns[1] / 1e6, 3),
                "slowest_ms_gen2": round(self.slowest_ns[2] / 1e6, 3)}

    # ------------------------------------------------------------------ the task
    def guard_ns(self, generation: int) -> int:
        """How clear of the next release a collection of ``generation`` must start."""
        return max(self.min_guard_ns, 3 * self._cost_ns[generation])

    def step(self, now_ns: int | None = None) -> int | None:
        """Run one due collection if the moment allows; returns the generation run."""
        young_runs = gc.get_count()[1]  # young collections since generation 1 last ran
        if young_runs < self._t1:
            return None
        gen = 2 if self._gen1_runs >= self._t2 else 1
        overdue = young_runs >= self._t1 * self.max_defer
        now = _monotonic_ns() if now_ns is None else now_ns
        soonest = soonest_release()
        quiet = soonest is None or soonest - now > self.guard_ns(gen)
        if not quiet and gen == 2 and soonest is not None and \
                soonest - now > self.guard_ns(1):
            gen = 1  # a full collection does not fit the gap; generation 1 does
            quiet = True
        if not (quiet or overdue):
            return None
        t0 = _monotonic_ns()
        gc.collect(gen)
        took = _monotonic_ns() - t0
        self._gen1_runs = 0 if gen == 2 else self._gen1_runs + 1
        self.collections[gen] += 1
        self.forced += not quiet
        self.slowest_ns[gen] = max(self.slowest_ns[gen], took)
        # Decaying maximum: one slow collection widens the guard for a while, not forever.
        self._cost_ns[gen] = max(took, self._cost_ns[gen] * 7 // 8)
        return gen

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                self.step()
            except Exception:  # noqa: BLE001 - never let the collector's task die silently
                log.exception("quiet garbage collection failed")
