"""How fast `flowtrial demo` can run on this machine and still keep its promise.

The demo compresses time (``time_scale``) so a trial of 800 cycles runs in minutes. Its
manipulation check promises the simulated participants that every answer arrives within
:data:`DEMO_PROMISE_MS` of its target **in their time**: ``precision_ms`` raw × the time
scale (docs/concepts/manipulation.md#a-miss-and-the-tolerance). On a quiet machine the
proxy keeps its own 5 ms raw flag and the demo runs 75× faster. On a busy shared machine a
release waits for a core for longer than 5 ms, and at 75× each such wait is more than the
promise — no proxy can avoid it. A lower time scale makes such waits rarer (fewer releases
per second) but not shorter, so the raw precision follows the scale.

So before the run the demo measures the timer floor — how late plain 10 ms sleeps wake in a
process of its own session, as the proxy runs — and chooses the raw precision the machine
can keep (:data:`FLOOR_FACTOR` × the floor, at least 5 ms) and the whole time scale that keeps
precision × scale at the promise. A busier machine makes the demo slower, never its check
looser in the participants' time; the demo says so in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BASE_PRECISION_MS", "DEMO_MIN_TIME_SCALE", "DEMO_PROMISE_MS", "DEMO_TIME_SCALE",
           "FLOOR_FACTOR", "FLOOR_SECONDS", "DemoPace", "choose_pace", "measure_pace"]

#: The demo's time scale on a machine whose timers keep the proxy's 5 ms.
DEMO_TIME_SCALE = 75.0
#: The raw precision the proxy promises (its own violation flag; a test keeps them equal).
BASE_PRECISION_MS = 5.0
#: The promise in the participants' time: 5 ms raw × 75.
DEMO_PROMISE_MS = BASE_PRECISION_MS * DEMO_TIME_SCALE
#: The slowest the demo goes (5× its quiet-machine duration); a machine busier than
#: precision DEMO_PROMISE_MS / this (25 ms) may still see the check warn.
DEMO_MIN_TIME_SCALE = 15.0
#: How long the floor is measured before the run.
FLOOR_SECONDS = 2.0
#: The floor is the 99th percentile of the sleeps' lateness; the proxy, serving 40 clients
#: at once, was measured about twice to three times as late at its 95th percentile on the
#: same machine at the same time (docs/researchers/demo.md, "On a busy machine").
FLOOR_FACTOR = 3.0


@dataclass(frozen=True)
class DemoPace:
    """The time scale and raw precision a demo runs with, and the floor they came from."""

    time_scale: float
    precision_ms: float
    floor_ms: float | None  # None: not measured
    given: bool = False  # the caller chose the time scale

    @property
    def adapted(self) -> bool:
        return self.time_scale < DEMO_TIME_SCALE

    @property
    def promise_ms(self) -> float:
        return self.precision_ms * self.time_scale

    def line(self) -> str:
        """The one line the demo prints before its run."""
        if self.floor_ms is None:
            why = "given" if self.given else "the timer floor could not be measured"
            return (f"Time scale {self.time_scale:g} ({why}): a miss is more than "
                    f"{self.promise_ms:g} ms of the participants' time "
                    f"({self.precision_ms:g} ms raw).")
        head = (f"Timer floor {self.floor_ms:.1f} ms (99th percentile of 10 ms sleeps' "
                f"lateness over {FLOOR_SECONDS:g} s)")
        if not self.adapted:
            return (f"{head}: time scale {self.time_scale:g}; a miss is more than "
                    f"{self.promise_ms:g} ms of the participants' time.")
        slowest = FLOOR_FACTOR * (self.floor_ms or 0.0) > self.precision_ms
        tail = " (the slowest it goes: the check may still warn)" if slowest else ""
        return (f"{head}: this machine is busy, so the demo runs at time scale "
                f"{self.time_scale:.3g} instead of {DEMO_TIME_SCALE:g}, with "
                f"{self.precision_ms:.3g} ms raw precision, keeping a miss at more than "
                f"{DEMO_PROMISE_MS:g} ms of the participants' time{tail}; it takes about "
                f"{DEMO_TIME_SCALE / self.time_scale:.1f}× as long.")


def choose_pace(lateness_ms: list[float]) -> DemoPace:
    """The pace for sleeps that woke ``lateness_ms`` late (empty: the probe could not run,
    so the quiet-machine pace)."""
    if not lateness_ms:
        return DemoPace(DEMO_TIME_SCALE, BASE_PRECISION_MS, None)
    ordered = sorted(lateness_ms)
    floor = max(0.0, ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)])
    needed = max(BASE_PRECISION_MS, FLOOR_FACTOR * floor)
    # A whole time scale, so the study file and the report show round numbers.
    scale = float(max(DEMO_MIN_TIME_SCALE, min(DEMO_TIME_SCALE,
                                               math.floor(DEMO_PROMISE_MS / needed))))
    return DemoPace(scale, DEMO_PROMISE_MS / scale, floor)


def measure_pace() -> DemoPace:
    """Measure this machine's timer floor now (:data:`FLOOR_SECONDS`) and choose the pace."""
    from flowtrial.study.simulator.timing import timer_lateness_ms

    return choose_pace(timer_lateness_ms(FLOOR_SECONDS))
