"""Shared helpers for the proxy benchmarks: studies, subprocess servers, percentiles.

The proxy and the simulated model run in their own processes so the load generator's Python
work (and GIL) does not disturb the timings being measured.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def write_study(directory: Path, body: str) -> Path:
    path = directory / "study.toml"
    path.write_text(body, encoding="utf-8")
    return path


def enroll_keys(study: Path, db: Path, n: int) -> list[str]:
    """Create the database and enroll ``n`` participants; their keys."""
    from flowtrial.study.config import load_study
    from flowtrial.study.participants import enroll
    from flowtrial.study.storage import init_db

    config = load_study(study)
    database = init_db(db, config, study.read_text(encoding="utf-8"))
    keys = [enroll(database, config, f"p{i:03d}")[1] for i in range(n)]
    database.dispose()
    return keys


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Served(str):
    """A base URL that also knows the serving process's pid."""

    pid: int


def wait_ready(url: str, timeout: float = 60.0) -> None:
    """Poll ``url`` until it answers (servers print their address before they listen)."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def _process(args: list[str], pattern: str, env: dict[str, str] | None = None,
             timeout: float = 60.0, ready: str = "") -> Iterator[Served]:
    """Start ``args``, wait for a stdout line matching ``pattern`` and for ``group 1 +
    ready`` to answer; yield group 1."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or _env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"{args[:4]} exited: {err[-2000:]}")
            m = rx.search(line)
            if m:
                served = Served(m.group(1))
                served.pid = proc.pid
                wait_ready(served + ready, timeout)
                yield served
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{args[:4]} did not start")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def proxy_process(study: Path, db: Path, env: dict[str, str] | None = None, *extra: str
                  ) -> Iterator[Served]:
    """``python -m flowtrial.proxy_assembly`` on a free port (``extra``: options); yields
    its base URL."""
    args = [sys.executable, "-m", "flowtrial.proxy_assembly", "--study", str(study),
            "--db", str(db), "--port", "0", *extra]
    with _process(args, r"^OPENAI_BASE_URL=(http://\S+)/v1", env,
                  ready="/flowtrial/v1/health") as url:
        yield url


@contextmanager
def mock_model_process(ttft_ms: float = 0.0, tokens_per_second: float = 2000.0,
                       answer_tokens: int | None = None) -> Iterator[Served]:
    """The simulated model served over HTTP (as ``flowtrial mock-model``; ``answer_tokens``:
    every answer that long); yields ``http://host:port/v1``."""
    code = ("import typer; from flowtrial.instrumentation.mock_model.commands import mock_model; "
            "typer.run(mock_model)")
    args = [sys.executable, "-c", code, "--port", "0", "--ttft-ms", str(ttft_ms),
            "--tokens-per-second", str(tokens_per_second)]
    if answer_tokens:
        args += ["--answer-tokens", str(answer_tokens)]
    with _process(args, r"simulated model at (http://\S+/v1)", ready="/models") as url:
        yield url


BENCH_KEY_ENV = "FLOWTRIAL_BENCH_UPSTREAM_KEY"


def upstream_section(mock_url: str | None, upstream_tps: float | str = "inf",
                     answer_tokens: int | None = None) -> str:
    """The study's ``[upstream]`` TOML: the simulated model inside the proxy (``mock_url``
    None), or served over HTTP at ``mock_url`` (``http://host:port/v1``) for both the OpenAI
    and the Anthropic side, with the key read from :data:`BENCH_KEY_ENV`."""
    if mock_url is None:
        return ("[upstream]\nkind = \"mock\"\n[upstream.mock]\n"
                f"tokens_per_second = {upstream_tps}\nttft_ms = 20\n"
                + (f"answer_tokens = {answer_tokens}\n" if answer_tokens else ""))
    root = mock_url.removesuffix("/v1")
    return (f'[upstream.openai]\nbase_url = "{mock_url}"\napi_key_env = "{BENCH_KEY_ENV}"\n'
            f'[upstream.anthropic]\nbase_url = "{root}"\napi_key_env = "{BENCH_KEY_ENV}"\n')


def add_shaping_options(ap: Any, upstream: str) -> None:
    """The options the shaping benchmarks share (``upstream``: the default model placement)."""
    ap.add_argument("--upstream", choices=["http", "inprocess"], default=upstream,
                    help="simulated model as a separate HTTP server (as a real API is) or "
                         "inside the proxy process")
    ap.add_argument("--stagger-ms", type=float, default=5.0,
                    help="gap between stream starts (all concurrent after the ramp)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-quiet-gc", action="store_true",
                    help="proxy.quiet_gc = false: CPython's own garbage-collection schedule "
                         "(for an A/B comparison)")
    add_placement_options(ap)


#: The CPUs this benchmark may use, before --pin splits them.
ALL_CPUS = sorted(os.sched_getaffinity(0))


def add_placement_options(ap: Any) -> None:
    """Where and how the proxy runs against its load: ``--priority``, ``--pin``,
    ``--isolate``, ``--witness`` (see :func:`pin_load_generator`, :func:`place_proxy`,
    :func:`shielded_cpu`, :func:`witness_for`)."""
    ap.add_argument("--priority", type=int, default=0,
                    help="nice value for the proxy's event-loop thread (e.g. -10, needs "
                         "root): the proxy as if it had a CPU to itself on a busy machine")
    ap.add_argument("--pin", action="store_true",
                    help="the proxy on a CPU of its own (the last one), this load generator "
                         "and the simulated model on the others: as deployed, where the "
                         "clients run on other machines")
    ap.add_argument("--isolate", action="store_true",
                    help="with --pin: shield the proxy's CPU for the run, moving every other "
                         "task that can move (other processes, kernel threads such as "
                         "kdamond) to the other CPUs, as isolcpus or a cpuset does on a "
                         "dedicated proxy host (needs root; restored afterwards)")
    ap.add_argument("--witness", action="store_true",
                    help="with --pin: a real-time process on the proxy's CPU notes every "
                         "moment that CPU was gone (needs root); each release later than "
                         "2 ms is then checked against them")


def pin_load_generator(args: Any) -> None:
    """With ``--pin``: this process, and the servers it starts from now on, on every CPU but
    the last (call before starting them)."""
    if args.witness and not args.pin:
        raise SystemExit("--witness needs --pin (the witness watches the proxy's CPU)")
    if args.isolate and not args.pin:
        raise SystemExit("--isolate needs --pin (it shields the proxy's CPU)")
    if args.pin:
        if len(ALL_CPUS) < 2:
            raise SystemExit("--pin needs at least 2 CPUs")
        os.sched_setaffinity(0, ALL_CPUS[:-1])


def place_proxy(args: Any, pid: int) -> None:
    """Apply ``--priority`` (the event-loop thread) and ``--pin`` (every thread, on the last
    CPU) to the proxy process ``pid``."""
    if args.priority:
        os.setpriority(os.PRIO_PROCESS, pid, args.priority)
    if args.pin:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), {ALL_CPUS[-1]})


@contextmanager
def shielded_cpu(args: Any) -> Iterator[dict[str, Any]]:
    """With ``--isolate``: every task allowed on the proxy's CPU and others (everything but
    the pinned proxy and witness, and per-CPU kernel threads, which cannot move) is moved
    off it until the block ends. Yields what was moved, for the report."""
    report: dict[str, Any] = {}
    if not args.isolate:
        yield report
        return
    cpu = ALL_CPUS[-1]
    saved: dict[int, set[int]] = {}
    kernel: list[str] = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):
            for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                with suppress(OSError):
                    allowed = os.sched_getaffinity(tid)
                    if cpu not in allowed or len(allowed) < 2:
                        continue
                    os.sched_setaffinity(tid, allowed - {cpu})
                    saved[tid] = allowed
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[1] == "2":  # child of kthreadd
                        kernel.append(stat[stat.index("(") + 1:stat.rindex(")")])
    report["tasks_moved_off_proxy_cpu"] = len(saved)
    report["kernel_threads_moved"] = sorted(kernel)
    try:
        yield report
    finally:
        for tid, allowed in saved.items():
            with suppress(OSError):  # the task may have ended meanwhile
                os.sched_setaffinity(tid, allowed)


def proxy_cpu(args: Any) -> int | None:
    """The CPU the proxy is pinned to (None without ``--pin``)."""
    return ALL_CPUS[-1] if args.pin else None


class CpuSteal:
    """The share of CPU time the hypervisor gave to other guests while this machine wanted
    it (``steal`` in /proc/stat), from construction to :meth:`pct`."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[7] if len(fields) > 7 else 0, sum(fields[:8])

    def pct(self) -> float:
        steal, total = self._read()
        d_total = max(1, total - self._start[1])
        return round((steal - self._start[0]) / d_total * 100, 2)


class RunDelay:
    """How long each of the proxy's threads waited, runnable, for a CPU (``run_delay`` in
    /proc/PID/task/TID/schedstat), from construction to :meth:`summary`: the time other
    tasks on its CPU held it off (its own threads, kernel threads), which a real-time witness
    cannot see because it preempts them all. Stolen time is not in it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self._start = self._read()

    def _read(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            with suppress(OSError):
                fields = Path(f"/proc/{self.pid}/task/{tid}/schedstat").read_text().split()
                out[int(tid)] = int(fields[1])
        return out

    def summary(self) -> dict[str, float]:
        """Milliseconds waited per second of run: the event loop's thread, the others."""
        now, dt = self._read(), max(1e-9, time.monotonic() - self.t0)
        waited = {tid: ns - self._start.get(tid, 0) for tid, ns in now.items()}
        loop = waited.pop(self.pid, 0)
        return {"event_loop_thread_ms_per_s": round(loop / 1e6 / dt, 3),
                "other_threads_ms_per_s": round(sum(waited.values()) / 1e6 / dt, 3)}


def proxy_toml(args: Any) -> str:
    """The study's ``[proxy]`` section for :func:`add_shaping_options`' choices."""
    return "\n[proxy]\nquiet_gc = false\n" if args.no_quiet_gc else ""


def upstream_env() -> dict[str, str]:
    """The environment for a proxy whose upstream is :func:`upstream_section` over HTTP."""
    return _env() | {BENCH_KEY_ENV: "sk-bench-not-a-real-key"}


RELAY = """
import asyncio, socket, sys
import uvloop

UP_HOST, UP_PORT = sys.argv[1], int(sys.argv[2])

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
    finally:
        writer.close()

async def handle(cr, cw):
    ur, uw = await asyncio.open_connection(UP_HOST, UP_PORT)
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw), return_exceptions=True)

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"relay at http://127.0.0.1:{port}/v1", flush=True)
    await server.serve_forever()

uvloop.run(main())
"""


@contextmanager
def tcp_relay_process(upstream: str) -> Iterator[Served]:
    """A bare byte-for-byte TCP relay (uvloop, no HTTP parsing) in front of ``upstream``
    (``http://host:port/v1``): the floor under any user-space proxy hop on this machine."""
    host, port = upstream.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    args = [sys.executable, "-c", RELAY, host, port]
    with _process(args, r"relay at (http://\S+/v1)", ready="/models") as url:
        yield url


TIMER_PROBE = """
import asyncio, json, os, sys, time
try:
    import uvloop
except ImportError:
    uvloop = None

async def main(seconds):
    late = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        due = time.monotonic_ns() + 3_000_000
        await asyncio.sleep(0.003)
        late.append((time.monotonic_ns() - due) / 1e6)
    late.sort()
    # A busy loop reading the clock: a gap means this thread had no CPU (another process,
    # or the hypervisor took the virtual CPU). Nothing on the machine can time below this.
    gaps, last = [], time.monotonic_ns()
    end = last + int(seconds * 1e9)
    while last < end:
        now = time.monotonic_ns()
        if now - last > 500_000:
            gaps.append(now - last)
        last = now
    print(json.dumps({"p50": late[len(late) // 2], "p99": late[int(len(late) * 0.99)],
                      "cpu_stalls_over_1ms_per_s": round(
                          sum(g > 1_000_000 for g in gaps) / seconds, 1),
                      "cpu_stall_max_ms": round(max(gaps, default=0) / 1e6, 2),
                      "cpu_stalled_pct": round(sum(gaps) / (seconds * 1e9) * 100, 2)}))

if len(sys.argv) > 2:
    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[2]))
(uvloop.run if uvloop else asyncio.run)(main(float(sys.argv[1])))
"""


WITNESS = """
import json, os, signal, sys, time

os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    realtime = True
except OSError:
    realtime = False
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
period, late = 500_000, 1_000_000
gaps, last, mono = [], time.monotonic_ns(), time.monotonic_ns
print("ready", flush=True)
while not stop:
    time.sleep(period / 1e9)
    now = mono()
    if now - last > period + late:
        gaps.append((last + period, now))
    last = now
print(json.dumps({"realtime": realtime, "gaps": gaps}), flush=True)
"""


class StallWitness:
    """A tiny real-time process on the pinned proxy's CPU that wakes every 0.5 ms and notes
    every wake more than 1 ms late. A real-time task preempts the proxy at once, so such a gap
    means the CPU itself was gone (the hypervisor ran another guest, or the kernel was busy)
    — time no process on that CPU could have used. :meth:`stalled` says whether a window
    overlaps one. Needs root (SCHED_FIFO); without it the witness is an ordinary process and
    :attr:`realtime` is False (then its gaps include waiting for the proxy)."""

    def __init__(self, cpu: int) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", WITNESS, str(cpu)],
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self._proc.stdout.readline()  # "ready"
        self._t0 = time.monotonic()
        self.seconds = 0.0
        self.gaps: list[tuple[int, int]] = []
        self.realtime = False

    def finish(self) -> None:
        """Stop the witness and collect its gaps."""
        import json

        self._proc.send_signal(signal.SIGTERM)
        self.seconds = time.monotonic() - self._t0
        out, _ = self._proc.communicate(timeout=30)
        got = json.loads(out.strip().splitlines()[-1])
        self.gaps = [tuple(g) for g in got["gaps"]]
        self.realtime = bool(got["realtime"])

    def stalled(self, start_ns: int, end_ns: int) -> bool:
        """Whether a CPU stall overlaps [start_ns, end_ns]."""
        return any(a < end_ns and b > start_ns for a, b in self.gaps)

    def summary(self) -> dict[str, Any]:
        """What the witness saw, over its lifetime."""
        total, seconds = sum(b - a for a, b in self.gaps), self.seconds
        return {"realtime": self.realtime, "stalls_over_1ms": len(self.gaps),
                "stalls_per_s": round(len(self.gaps) / max(seconds, 1e-9), 2),
                "longest_ms": round(max((b - a for a, b in self.gaps), default=0) / 1e6, 2),
                "stalled_pct": round(total / max(seconds, 1e-9) / 1e7, 2)}


def witness_for(args: Any) -> StallWitness | None:
    """A :class:`StallWitness` on the pinned proxy's CPU with ``--witness``, else None."""
    return StallWitness(ALL_CPUS[-1]) if args.witness else None


def attribute_misses(witness: StallWitness, misses: list[tuple[int, int, float]],
                     bound_ms: float) -> dict[str, Any]:
    """Of the releases whose |TTFT error| exceeded ``bound_ms`` (``misses``: due ns, first
    byte sent ns, error ms), how many had the proxy's CPU stalled between due and sent."""
    over = [m for m in misses if abs(m[2]) > bound_ms]
    unexplained = [m for m in over if not witness.stalled(m[0] - 1_000_000, max(m[0], m[1]))]
    return {"bound_ms": bound_ms, "over_bound": len(over),
            "over_bound_with_cpu_stalled": len(over) - len(unexplained),
            "over_bound_cpu_not_stalled_errors_ms": sorted(round(abs(m[2]), 2)
                                                           for m in unexplained)}


def timer_noise(seconds: float = 2.0, nice: int = 0, cpu: int | None = None
                ) -> dict[str, float]:
    """Lateness (ms) of a bare ``asyncio.sleep`` on this machine right now, and how often a
    busy thread loses its CPU (stalls over 1 ms per second, the longest, the share of time):
    the floor under any event-loop timing, whatever the proxy does. ``cpu``: probe on that
    CPU only (the pinned proxy's)."""
    import json

    args = [sys.executable, "-c", TIMER_PROBE, str(seconds)] + ([str(nice)] if nice else [])
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    out = subprocess.run(args, capture_output=True, text=True, check=True, preexec_fn=pin)
    return json.loads(out.stdout)  # type: ignore[no-any-return]
