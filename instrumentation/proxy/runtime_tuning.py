"""The proxy's runtime timing tweaks, in one place: what they are, why, and where they apply.

A first token released 1-5 ms late is a measurement error (docs/concepts/shaping.md); on a shared
machine most of those milliseconds come from the Python runtime rather than from the proxy's
own work. :class:`ProxyTuning` is applied once, in the proxy app's lifespan (every way of
running the proxy — ``flowtrial proxy``, its ``--workers``, ``serve_proxy``, the demo and
the live simulator — starts the app), and undone at its end:

- **GIL hand-over interval** (:data:`SWITCH_INTERVAL_S`): the writer thread (SQLAlchemy) and
  the threads running database reads must not hold the event loop off for Python's default
  5 ms. Process-wide; the shortest interval asked for wins while several apps run.
- **Frozen start-up heap** (``gc.freeze``): a full collection walks every object the imports
  made (~140k: numpy, SQLAlchemy, pydantic ...) and stalls the loop for ~100 ms; frozen, they
  are never walked again. Later garbage is collected as usual.
- **Quiet garbage collection** (``proxy.quiet_gc``): generations 1 and 2 run between precise
  releases (:class:`~flowtrial.instrumentation.proxy.quiet_gc.QuietCollector`).
- **Writer thread priority** (:data:`WRITER_NICE`, through the record writer's thread-start
  hook, :func:`writer_thread_started`): a commit that ran its time slice out held the loop
  off for 1-4 ms (``perf sched``); nicer, it still commits whenever the loop is idle.

Giving way (:func:`give_way`, :mod:`~flowtrial.instrumentation.proxy.releases`) cannot be
applied at start-up: it is a yield at the exact points where work that can wait would
otherwise run ahead of a due first token. It is called inline, through this module, in four
places: a paced later token that falls due (``shaping.sleep_until``), the next slice of a
prefetched upstream chunk (``sources.Prefetch``), a new request's JSON parse (``app``) and a
new WebSocket message's (``websocket``).

:func:`tuned_process` is the same switch-interval and frozen-heap tweak for a process that
runs clients and the proxy together (the live simulator).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Iterator

from .quiet_gc import QuietCollector
from .releases import give_way

__all__ = [
    "SWITCH_INTERVAL_S", "WRITER_NICE", "ProxyTuning", "give_way", "lower_thread_priority",
    "tuned_process", "writer_thread_started",
]

#: GIL hand-over interval while the proxy runs.
SWITCH_INTERVAL_S = 0.001
#: The writer thread runs this much nicer than the event loop, which it must never hold off.
WRITER_NICE = 5


def lower_thread_priority(by: int) -> None:
    """Raise the calling thread's nice value by ``by`` (Linux schedules threads one by one;
    elsewhere, and where it is refused, this does nothing)."""
    if sys.platform != "linux" or by <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError:
        pass


def writer_thread_started() -> None:
    """The record writer's thread-start hook: run :data:`WRITER_NICE` nicer."""
    lower_thread_priority(WRITER_NICE)


class _SwitchInterval:
    """Process-wide: the shortest interval asked for holds until the last user leaves."""

    _lock = threading.Lock()
    _asked: list[float] = []
    _saved: float | None = None

    @classmethod
    def enter(cls, seconds: float) -> None:
        with cls._lock:
            if not cls._asked:
                cls._saved = sys.getswitchinterval()
            cls._asked.append(seconds)
            assert cls._saved is not None
            sys.setswitchinterval(min([cls._saved, *cls._asked]))

    @classmethod
    def leave(cls, seconds: float) -> None:
        with cls._lock:
            cls._asked.remove(seconds)
            assert cls._saved is not None
            sys.setswitchinterval(min([cls._saved, *cls._asked]))
            if not cls._asked:
                cls._saved = None


class ProxyTuning:
    """The tweaks above, applied by the app's lifespan (:meth:`start` / :meth:`stop`)."""

    def __init__(self, quiet_gc: bool = True,
                 switch_interval_s: float = SWITCH_INTERVAL_S) -> None:
        self.switch_interval_s = switch_interval_s
        self.collector = QuietCollector() if quiet_gc else None
        self._started = False

    async def start(self) -> None:
        """Apply them (on the event loop that runs the proxy)."""
        _SwitchInterval.enter(self.switch_interval_s)
        self._started = True
        gc.collect()
        gc.freeze()
        if self.collector is not None:
            self.collector.start()

    async def stop(self) -> None:
        """Undo them (the frozen heap stays frozen: unfreezing would only cost a walk)."""
        if self.collector is not None:
            await self.collector.stop()
        if self._started:
            _SwitchInterval.leave(self.switch_interval_s)
            self._started = False


@contextlib.contextmanager
def tuned_process(switch_interval_s: float) -> Iterator[None]:
    """A short GIL hand-over interval and a frozen heap for the block (then undone)."""
    _SwitchInterval.enter(switch_interval_s)
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        _SwitchInterval.leave(switch_interval_s)
