"""``flowtrial demo``: a whole latency trial in 2–5 minutes, offline.

It writes a per-prompt study (TTFT drawn log-uniform over 1-64 s, spanning the 8 s
threshold, with ``time_scale`` compressing everything so it runs in minutes), starts the
proxy with the built-in simulated model in-process on a free loopback port, lets simulated
participants work through it with the official ``openai`` SDK (live mode: the whole
product path), runs the analysis when ``flowtrial.analysis.report.run_analysis`` is available, and
summarises. No API key and no network beyond 127.0.0.1.

The demo directory holds ``study.toml``, ``flowtrial.db``, ``report/`` and a marker file;
re-running replaces it (only a directory that has the marker, or an empty one).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtrial.demo_pace import BASE_PRECISION_MS, DEMO_TIME_SCALE, DemoPace, measure_pace
from flowtrial.study.errors import FlowtrialError

MARKER = ".flowtrial-demo"
# The demo's design, in one place (benchmarks/bench_demo_seeds.py measures exactly this).
# Sized so the threshold is found and its CI covers the truth in >= 19 of 20 seeds: with
# the literature defaults (spread τ = 0.35, P(switch) 3 % below ψ) even 1,200 cycles found
# it in 1 of 4 seeds, so the demo's people have a clearer threshold (see demo_sim_params).
DEMO_PARTICIPANTS = 40
# DEMO_TIME_SCALE (75) on a quiet machine; slower on a busy one (flowtrial.demo_pace).
DEMO_TASKS = 2
DEMO_PROMPTS_PER_TASK = 10
DEMO_TTFT_MS = (1000, 64000)  # log-uniform: three octaves either side of the 8 s threshold
DB_NAME = "flowtrial.db"
#: The simulated participants (the demo's own load: 40 SDK clients parsing streams, posting
#: events, reading the database) run this much nicer than the proxy, whose releases are the
#: product's promise: on a busy 2-core machine their CPU would otherwise delay first tokens
#: (docs/researchers/demo.md, "On a busy machine").
DEMO_LOAD_NICE = 10


def demo_sim_params() -> Any:
    """The simulated participants' behaviour (``SimParams``) the demo runs with: the defaults
    (docs/concepts/simulated-participants.md) with a threshold a small study can show —
    people's thresholds closer together (log-sd 0.2), a visible floor of switching below it
    (10 %: the hinge's flat part is what tells it from a smooth dose-response) and a steep
    rise (90 % at 4 × ψ)."""
    from flowtrial.study.simulator.params import SimParams

    return SimParams(threshold_logsd=0.2, p_low=0.10, p_high=0.90)


def demo_study_text(seed: int, time_scale: float = DEMO_TIME_SCALE,
                    ttft_ms: tuple[int, int] = DEMO_TTFT_MS,
                    precision_ms: float = BASE_PRECISION_MS) -> str:
    """The demo's study file."""
    lo, hi = ttft_ms
    return f"""\
# flowtrial demo study, written by `flowtrial demo`.
[study]
name = "flowtrial-demo"
seed = {seed}
design = "per_prompt"            # every request draws its own latency
unit = "prompt"
time_scale = {time_scale:g}  # runs {time_scale:g}x faster; analysis converts back
precision_ms = {precision_ms:g}  # raw; x time_scale = the check's promise in the participants' time

[upstream]
kind = "mock"                    # the built-in simulated model: no key, no network

[upstream.mock]
tokens_per_second = 1000000      # the model is never the bottleneck, so targets can be met
ttft_ms = 0
seed = {seed}

[per_prompt]
# {lo / 1000:g}-{hi / 1000:g} s log-uniform: spans the simulated 8 s threshold on both sides
ttft_ms = {{ min = {lo}, max = {hi}, scale = "log" }}

[capture]
content = "fingerprint"
switch_min_away_s = 10

[proxy]
host = "127.0.0.1"
port = 0
"""


@dataclass
class DemoResult:
    """What the demo produced."""

    dir: Path
    study_path: Path
    db_path: Path
    participants: int
    cycles: int
    violations: int
    switch_bands: list[dict[str, Any]]
    report_path: Path | None
    analysis_note: str | None
    replaced: bool
    elapsed_s: float
    timer_late_rate: float | None = None  # see study.simulator.timing
    pace: DemoPace | None = None  # the time scale and precision, and the floor they came from
    analysis: dict[str, Any] | None = field(default=None, repr=False)
    time_scale: float = DEMO_TIME_SCALE

    @property
    def violation_rate(self) -> float:
        return self.violations / self.cycles if self.cycles else 0.0

    @property
    def dashboard_command(self) -> str:
        return f"flowtrial dashboard --db {self.db_path}"

    def _manipulation_summary(self) -> str | None:
        """The report's manipulation-check sentence (None without an analysis)."""
        checks = (self.analysis or {}).get("checks") or {}
        summary = (checks.get("manipulation") or {}).get("summary")
        return summary if isinstance(summary, str) and summary else None

    def _threshold_line(self) -> str | None:
        return _threshold_line_of(self.analysis)

    def summary_lines(self) -> list[str]:
        """The short summary the CLI prints."""
        lines = [
            f"{self.cycles} cycles from {self.participants} simulated participants in "
            f"{self.elapsed_s:.0f} s ({self.dir}).",
            "Switch rate during the wait, by experienced TTFT:",
        ]
        for b in self.switch_bands:
            rate = "—" if b["rate"] is None else f"{b['rate'] * 100:4.0f} %"
            lines.append(f"  {b['band']:>9}  {rate}  ({b['switches']}/{b['cycles']})")
        if self.pace is not None:
            lines.append(self.pace.line())
        check = self._manipulation_summary()
        if check:  # the report's own verdict, in real time units (docs/concepts/manipulation.md)
            lines.append(check)
        lines.append(f"Proxy's raw 5 ms flag: {self.violations} of {self.cycles} "
                     f"({self.violation_rate * 100:.1f} %).")
        if self.violation_rate >= 0.01 and self.timer_late_rate and self.timer_late_rate >= 0.002:
            lines.append(
                f"  This machine is busy: {self.timer_late_rate * 100:.1f} % of plain 10 ms "
                "sleeps woke > 5 ms late during the run, and such wake-ups at a token's due "
                "time are violations.")
        psi = self._threshold_line()
        if psi:
            lines.append(psi)
        if self.report_path is not None:
            lines.append(f"Report: {self.report_path}")
        if self.analysis_note:
            lines.append(self.analysis_note)
        lines.append(f"Open the dashboard: {self.dashboard_command}")
        return lines


def _fmt_s(x: Any) -> str:
    return f"{x:.3g} s" if isinstance(x, int | float) else "?"


def _threshold_line_of(analysis: dict[str, Any] | None) -> str | None:
    """The report's threshold headline (same sentence, numbers, CI and units), then the
    simulation's truth for comparison."""
    if not analysis:
        return None
    thr = analysis.get("threshold") or {}
    headline = thr.get("headline")
    if not headline:
        return None
    truth = analysis.get("ground_truth") or {}
    true = truth.get("threshold_s") if truth.get("has_threshold") else None
    if true:
        return (f"{headline} Simulated truth: the participants' median personal threshold "
                f"is {_fmt_s(true)}.")
    if truth:
        return f"{headline} Simulated truth: no threshold ({truth.get('truth_model')} model)."
    return headline


def _prepare_dir(path: Path, say: Callable[[str], None]) -> bool:
    """Make ``path`` an empty demo directory; True if an earlier demo was replaced."""
    if path.exists() and not path.is_dir():
        raise FlowtrialError(f"{path} is a file, not a directory: choose another --dir")
    replaced = False
    if path.exists() and any(path.iterdir()):
        if not (path / MARKER).exists():
            raise FlowtrialError(
                f"{path} exists and is not a flowtrial demo directory: choose another --dir "
                "(the demo only replaces directories it made)"
            )
        say(f"Replacing the earlier demo in {path}.")
        shutil.rmtree(path)
        replaced = True
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by `flowtrial demo`; re-running replaces this directory\n",
                               encoding="utf-8")
    return replaced


def _run_analysis(db_path: Path, out_dir: Path) -> tuple[Path | None, str | None, Any]:
    try:
        from flowtrial.analysis.report import run_analysis
    except ImportError as exc:
        return None, (f"Analysis skipped: the analysis extra is not installed ({exc}): "
                      "pip install 'flowtrial[analysis]'."), None
    try:
        results = run_analysis(db_path, out_dir)
    except Exception as exc:  # noqa: BLE001 - the demo's data stays useful without a report
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"Analysis failed ({type(exc).__name__}: {first}); the data is in the " \
            "database.", None
    report = out_dir / "report.html"
    return (report if report.exists() else None), None, results


def _niced(fn: Callable[[], Any], by: int) -> Any:
    """``fn()`` on a thread ``by`` nicer than this process (Linux; elsewhere at the same
    priority). Threads it starts inherit its nice value; the caller's thread keeps its own,
    so the analysis afterwards runs at the user's priority."""
    from flowtrial.instrumentation.proxy.runtime_tuning import lower_thread_priority

    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        lower_thread_priority(by)
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            err.append(exc)

    worker = threading.Thread(target=run, name="flowtrial-demo-participants", daemon=True)
    worker.start()
    worker.join()
    if err:
        raise err[0]
    return out[0]


def _simulate(database: Any, config: Any, enrolled: tuple[list[str], list[str], int],
              tasks: int, prompts: int, seed: int, base_url: str, total: int | None,
              console: Any, nice: int = 0) -> Any:
    """The live simulation of the ``enrolled`` participants against the running proxy, with
    a progress bar when ``total``, on a thread ``nice`` nicer than the proxy's process."""
    from flowtrial.live_simulation import simulate_live

    args = (database, config, demo_sim_params(), len(enrolled[0]), tasks, prompts, seed)
    if total is None:
        return _niced(lambda: simulate_live(*args, base_url=base_url, enrolled=enrolled),
                      nice)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task("simulated participants at work", total=total)
        return _niced(lambda: simulate_live(
            *args, base_url=base_url, enrolled=enrolled,
            progress=lambda done, _t: bar.update(job, completed=done)), nice)


@contextlib.contextmanager
def proxy_process(study_path: Path, db_path: Path, log_path: Path) -> Iterator[str]:
    """Run `flowtrial proxy` as its own process, as a real deployment does; yield its URL.

    In one process with a dozen simulated SDK clients the proxy would share their GIL, and
    the clients' JSON parsing would make its first tokens late by milliseconds.

    It runs in its own session (``start_new_session``): where Linux groups CPU time by
    session (autogroup, ``/proc/sys/kernel/sched_autogroup_enabled``), the proxy — the
    instrument — then gets a share of its own instead of queueing behind the terminal's
    other work, including the demo's own participants (docs/researchers/demo.md, "On a busy
    machine"). Ctrl-C reaches the demo only; it stops the proxy with SIGTERM below.
    """
    log = log_path.open("w", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.proxy_assembly", "--study", str(study_path),
         "--db", str(db_path), "--port", "0"],
        stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        url = _wait_for_proxy(proc, log_path)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful: open streams finish, records are written
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_for_proxy(proc: subprocess.Popen[str], log_path: Path, timeout: float = 60) -> str:
    import httpx

    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FlowtrialError(f"the demo proxy exited early: see {log_path}")
        if url is None:
            for line in log_path.read_text(encoding="utf-8").splitlines():
                if line.startswith("OPENAI_BASE_URL="):
                    url = line.split("=", 1)[1].strip().removesuffix("/v1")
        if url is not None:
            try:
                if httpx.get(url + "/flowtrial/v1/health", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise FlowtrialError(f"the demo proxy did not start within {timeout:g} s: see {log_path}")


def run_demo(
    dir: Path | str = Path("flowtrial-demo"),
    participants: int = DEMO_PARTICIPANTS,
    seed: int = 1,
    progress: bool = True,
    *,
    tasks: int = DEMO_TASKS,
    prompts_per_task: int = DEMO_PROMPTS_PER_TASK,
    time_scale: float | None = None,
    analyze: bool = True,
    say: Callable[[str], None] | None = None,
    load_nice: int = DEMO_LOAD_NICE,
) -> DemoResult:
    """Run the demo end to end in ``dir`` (replacing an earlier demo there), at
    ``time_scale`` (default: the pace this machine's timer floor allows, measured first,
    see :mod:`flowtrial.demo_pace`), the participants ``load_nice`` nicer than the proxy."""
    from rich.console import Console

    from flowtrial.study.config import load_study
    from flowtrial.study.simulator.records import enroll_simulated
    from flowtrial.study.simulator.summary import study_glance
    from flowtrial.study.storage import init_db

    if participants < 1:
        raise FlowtrialError(f"--participants {participants}: need at least 1 participant")
    console = Console(stderr=True)
    say = say or (lambda m: console.print(m, highlight=False))
    started = time.perf_counter()
    path = Path(dir)
    replaced = _prepare_dir(path, say)
    pace = (measure_pace() if time_scale is None
            else DemoPace(time_scale, BASE_PRECISION_MS, None, given=True))
    if progress:
        say(pace.line())
    study_path = path / "study.toml"
    text = demo_study_text(seed, pace.time_scale, precision_ms=pace.precision_ms)
    study_path.write_text(text, encoding="utf-8")
    config = load_study(study_path)
    db_path = path / DB_NAME
    database = init_db(db_path, config, text)
    try:
        total = participants * tasks * prompts_per_task
        # Enrolled before the proxy starts: it claims their draw indices in one transaction.
        enrolled = enroll_simulated(database, config, participants)
        with proxy_process(study_path, db_path, path / "proxy.log") as base_url:
            sim = _simulate(database, config, enrolled, tasks, prompts_per_task, seed,
                            base_url, total if progress else None, console, load_nice)
        glance = study_glance(database)
    finally:
        database.dispose()
    note: str | None = "Analysis skipped (analyze=False)."
    report_path, results = None, None
    if analyze:
        if progress:
            say("Running the analysis ...")
        report_path, note, results = _run_analysis(db_path, path / "report")
    return DemoResult(
        dir=path, study_path=study_path, db_path=db_path, participants=glance.participants,
        cycles=glance.cycles, violations=glance.violations, switch_bands=glance.bands,
        report_path=report_path, analysis_note=note, replaced=replaced,
        elapsed_s=time.perf_counter() - started,
        timer_late_rate=sim.extra.get("timer_late_rate"), analysis=results,
        time_scale=pace.time_scale, pace=pace,
    )
