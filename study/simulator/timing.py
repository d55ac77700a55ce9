"""How punctual this machine's timers are while a live simulation runs.

The proxy meets a latency target by sleeping until the token is due; when the operating
system wakes it more than the proxy's tolerance (5 ms) late, the cycle is a manipulation
violation that no proxy could have avoided. On a machine busy with other jobs that happens
now and then, and time compression (``time_scale``) cannot hide it: 5 ms raw is 5 ms × scale
of real time. :class:`TimerProbe` measures it in a separate process (so our own threads do
not count) over exactly the period of a run, so a violation rate can be judged against it.
"""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType

#: 10 ms sleeps for argv[1] seconds (0: until stdin closes); prints each one's lateness, ms.
_PROBE = """
import asyncio, sys, threading, time
seconds = float(sys.argv[1])
stop = threading.Event()
if seconds <= 0:
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
async def main():
    late = []
    end = time.perf_counter() + seconds if seconds > 0 else float("inf")
    while not stop.is_set() and time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        late.append((time.perf_counter() - t - 0.01) * 1000)
    print(" ".join(f"{x:.3f}" for x in late))
asyncio.run(main())
"""


def _lateness(out: str) -> list[float]:
    return [float(x) for x in out.split()]


class TimerProbe:
    """Context manager: the share of 10 ms sleeps that woke more than ``late_ms`` late.

    ``rate`` is set on exit (None if the probe could not run).
    """

    def __init__(self, late_ms: float = 5.0) -> None:
        self.late_ms = late_ms
        self.rate: float | None = None
        self.samples = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> TimerProbe:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _PROBE, "0"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._proc is None:
            return
        try:
            out, _ = self._proc.communicate(input="", timeout=10)
            late = _lateness(out)
        except (subprocess.TimeoutExpired, ValueError):
            self._proc.kill()
            self._proc.wait()
            return
        self.samples = len(late)
        self.rate = sum(x > self.late_ms for x in late) / len(late) if late else None


def timer_lateness_ms(seconds: float = 2.0) -> list[float]:
    """How late (ms) each of ``seconds`` worth of plain 10 ms sleeps woke, measured before a
    run in a process of its own session — as `flowtrial demo` starts its proxy, so under
    Linux autogroup it gets the proxy's share of the CPU. Empty if the probe could not run."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, str(seconds)], capture_output=True,
            text=True, timeout=seconds + 30, start_new_session=True, check=False).stdout
        return _lateness(out)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
