"""``flowtrial demo``: a whole latency trial in about a minute, offline.

It writes a per-prompt study (TTFT drawn log-uniform over 1-40 s, spanning the 8 s
threshold, with ``time_scale`` compressing everything so it runs in minutes), starts the
proxy with the built-in simulated model in-process on a free loopback port, lets simulated
participants work through it with the official ``openai`` SDK (live mode: the whole
product path), runs the analysis when ``analysis.report.run_analysis`` is available, and
summarises. No API key and no network beyond 127.0.0.1.

The demo directory holds ``study.toml``, ``flowtrial.db``, ``report/`` and a marker file;
re-running replaces it (only a directory that has the marker, or an empty one).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.errors import FlowtrialError

MARKER = ".flowtrial-demo"
DEMO_TIME_SCALE = 75.0
DEMO_TASKS = 2
DEMO_PROMPTS_PER_TASK = 7
DB_NAME = "flowtrial.db"


def demo_study_text(seed: int, time_scale: float = DEMO_TIME_SCALE) -> str:
    """The demo's study file."""
    return f"""\
# flowtrial demo study, written by `flowtrial demo`.
[study]
name = "flowtrial-demo"
seed = {seed}
design = "per_prompt"            # every request draws its own latency
unit = "prompt"
time_scale = {time_scale:g}  # runs {time_scale:g}x faster; analysis converts back

[upstream]
kind = "mock"                    # the built-in simulated model: no key, no network

[upstream.mock]
tokens_per_second = 1000000      # the model is never the bottleneck, so targets can be met
ttft_ms = 0
seed = {seed}

[per_prompt]
ttft_ms = {{ min = 1000, max = 40000, scale = "log" }}   # 1-40 s: spans the 8 s threshold

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
    analysis: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def violation_rate(self) -> float:
        return self.violations / self.cycles if self.cycles else 0.0

    @property
    def dashboard_command(self) -> str:
        return f"flowtrial dashboard --db {self.db_path}"

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
        lines.append(f"Manipulation violations: {self.violations} of {self.cycles} "
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
    return f"{x:.1f} s" if isinstance(x, int | float) else "?"


def _threshold_line_of(analysis: dict[str, Any] | None) -> str | None:
    """The analysis's threshold estimate against the simulation's truth, in one line."""
    if not analysis:
        return None
    thr = analysis.get("threshold") or {}
    truth = analysis.get("ground_truth") or {}
    psi, ci = thr.get("psi_s"), thr.get("ci_s")
    if psi is None:
        return None
    verdict = "threshold found" if thr.get("found") else "no threshold established"
    ci_text = f", 95 % CI {_fmt_s(ci[0])}-{_fmt_s(ci[1])}" if ci and len(ci) == 2 else ""
    true = truth.get("threshold_s")
    tail = f"; the simulated participants' true ψ is {_fmt_s(true)}" if true else ""
    return f"Threshold ψ (idle wait): {_fmt_s(psi)}{ci_text} ({verdict}){tail}."


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
        from analysis.report import run_analysis
    except ImportError as exc:
        return None, f"Analysis skipped: analysis.report.run_analysis is not available ({exc}).", \
            None
    try:
        results = run_analysis(db_path, out_dir)
    except Exception as exc:  # noqa: BLE001 - the demo's data stays useful without a report
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"Analysis failed ({type(exc).__name__}: {first}); the data is in the " \
            "database.", None
    report = out_dir / "report.html"
    return (report if report.exists() else None), None, results


def run_demo(
    dir: Path | str = Path("flowtrial-demo"),
    participants: int = 12,
    seed: int = 1,
    progress: bool = True,
    *,
    tasks: int = DEMO_TASKS,
    prompts_per_task: int = DEMO_PROMPTS_PER_TASK,
    time_scale: float = DEMO_TIME_SCALE,
    analyze: bool = True,
    say: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run the demo end to end in ``dir`` (replacing an earlier demo there)."""
    from rich.console import Console

    from study.config import load_study
    from study.simulator.live import simulate_live
    from study.simulator.params import SimParams
    from study.simulator.summary import study_glance
    from study.storage import init_db

    if participants < 1:
        raise FlowtrialError(f"--participants {participants}: need at least 1 participant")
    console = Console(stderr=True)
    say = say or (lambda m: console.print(m, highlight=False))
    started = time.perf_counter()
    path = Path(dir)
    replaced = _prepare_dir(path, say)
    study_path = path / "study.toml"
    text = demo_study_text(seed, time_scale)
    study_path.write_text(text, encoding="utf-8")
    config = load_study(study_path)
    db_path = path / DB_NAME
    database = init_db(db_path, config, text)
    try:
        total = participants * tasks * prompts_per_task
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
                job = bar.add_task("simulated participants at work", total=total)
                sim = simulate_live(database, config, SimParams(), participants, tasks,
                                    prompts_per_task, seed,
                                    progress=lambda done, _t: bar.update(job, completed=done))
        else:
            sim = simulate_live(database, config, SimParams(), participants, tasks,
                                prompts_per_task, seed)
        glance = study_glance(database)
    finally:
        database.dispose()
    report_path, note, results = None, "Analysis skipped (analyze=False).", None
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
    )
