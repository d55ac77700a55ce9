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

_PROBE = """
import asyncio, sys, threading, time
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
async def main():
    late = n = 0
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        late += (time.perf_counter() - t - 0.01) * 1000 > float(sys.argv[1])
        n += 1
    print(late, n)
asyncio.run(main())
"""


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
                [sys.executable, "-c", _PROBE, str(self.late_ms)], stdin=subprocess.PIPE,
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
            late, n = (int(x) for x in out.split())
        except (subprocess.TimeoutExpired, ValueError):
            self._proc.kill()
            self._proc.wait()
            return
        self.samples = n
        self.rate = late / n if n else None


_FLOOR_PROBE = """
import asyncio, sys, time
async def main(seconds):
    late = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        late.append((time.perf_counter() - t - 0.01) * 1000)
    print(" ".join(f"{x:.3f}" for x in late))
asyncio.run(main(float(sys.argv[1])))
"""


def timer_lateness_ms(seconds: float = 2.0) -> list[float]:
    """How late (ms) each of ``seconds`` worth of plain 10 ms sleeps woke, measured before a
    run in a process of its own session — as `flowtrial demo` starts its proxy, so under
    Linux autogroup it gets the proxy's share of the CPU. Empty if the probe could not run."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _FLOOR_PROBE, str(seconds)], capture_output=True,
            text=True, timeout=seconds + 30, start_new_session=True, check=False).stdout
        return [float(x) for x in out.split()]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
