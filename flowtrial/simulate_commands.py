"""CLI command functions of the simulator (registered on `flowtrial` by the lead).

``simulate`` -> ``flowtrial simulate``; ``demo`` -> ``flowtrial demo``. Heavy imports happen
inside the functions so ``flowtrial --help`` stays fast. User errors print one line on
stderr and exit with code 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from flowtrial.demo import DEMO_PARTICIPANTS
from flowtrial.study.errors import FlowtrialError

MODES = ("virtual", "live")
TRUTHS = ("hinge", "smooth", "flat")


def _fail(message: str) -> typer.Exit:
    for line in message.splitlines() or [message]:
        typer.echo(f"error: {line}", err=True)
    return typer.Exit(2)


@contextmanager
def _user_errors() -> Iterator[None]:
    """FlowtrialError anywhere below -> one line on stderr, exit 2 (also outside the app)."""
    try:
        yield
    except FlowtrialError as exc:
        raise _fail(str(exc)) from None


def _models(specs: list[str]) -> dict[str, Any]:
    """``NAME=TTFT_MS:TPS:SUCCESS`` options -> SimModel by name."""
    from flowtrial.study.simulator.capability import SimModel

    out = {}
    for spec in specs:
        name, _, rest = spec.partition("=")
        parts = rest.split(":")
        try:
            if len(parts) == 1:
                out[name] = SimModel(success=float(parts[0]))
            else:
                ttft, tps, success = (float(x) for x in parts)
                out[name] = SimModel(ttft_ms=ttft, tokens_per_second=tps, success=success)
        except (ValueError, TypeError):
            raise _fail(f"--model {spec!r}: give NAME=SUCCESS or NAME=TTFT_MS:TOKENS_PER_S:"
                        "SUCCESS, e.g. gpt-5.3-codex=0.8 or gpt-5.3-codex=2500:75:0.8 (TTFT "
                        "and pace > 0, 0 < success <= 1)") from None
        if not name:
            raise _fail(f"--model {spec!r}: the model's NAME is missing before '='")
    return out


def simulate(
    study: Annotated[Path, typer.Option("--study", help="The study file (study.toml).")],
    db: Annotated[str, typer.Option(
        "--db", help="Study database to write: a SQLite path or a SQLAlchemy URL.")],
    participants: Annotated[int, typer.Option(
        "--participants", help="Number of simulated participants to add.")],
    tasks: Annotated[int, typer.Option("--tasks", help="Tasks per participant.")] = 4,
    prompts_per_task: Annotated[int, typer.Option(
        "--prompts-per-task", help="Prompt cycles per task.")] = 15,
    mode: Annotated[str, typer.Option(
        "--mode", help="virtual (no HTTP, fast) or live (through the real proxy).")] = "virtual",
    truth: Annotated[str, typer.Option(
        "--truth", help="How waiting drives switching: hinge, smooth or flat.")] = "hinge",
    threshold_s: Annotated[float, typer.Option(
        "--threshold-s", help="Population threshold ψ of idle wait, seconds.")] = 8.0,
    threshold_sd: Annotated[float, typer.Option(
        "--threshold-sd", help="Log-sd of ψ across participants.")] = 0.35,
    seed: Annotated[int | None, typer.Option(
        "--seed", help="Seed of the simulated behaviour (default: random, recorded).")] = None,
    agent_steps: Annotated[int, typer.Option(
        "--agent-steps", help="Model calls per prompt: K > 1 simulates agent turns (K − 1 "
                              "tool calls with tool time between, then the answer; the "
                              "person waits for the whole turn). Live mode: the simulated "
                              "model makes the tool calls.")] = 1,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="Speed-vs-capability studies: a model the arms name, as NAME=SUCCESS "
                        "(the chance one answer does what was asked) or NAME=TTFT_MS:"
                        "TOKENS_PER_S:SUCCESS (its natural speed too, for arms whose upstream "
                        "is not a simulated model of its own); repeat for each model.")] = None,
    steps_per_task: Annotated[int, typer.Option(
        "--steps-per-task", help="With --model: good answers a task needs (it takes as many "
                                 "attempts as that needs, up to --prompts-per-task).")] = 2,
) -> None:
    """Add simulated participants with known ground truth to a study database."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if participants < 1:
        raise _fail(f"--participants {participants}: need at least 1")
    if tasks < 1:
        raise _fail(f"--tasks {tasks}: need at least 1")
    if prompts_per_task < 1:
        raise _fail(f"--prompts-per-task {prompts_per_task}: need at least 1")
    if mode not in MODES:
        raise _fail(f"--mode {mode!r} is not a mode: use virtual or live")
    if truth not in TRUTHS:
        raise _fail(f"--truth {truth!r} is not a truth model: use hinge, smooth or flat")
    if not threshold_s > 0:
        raise _fail(f"--threshold-s {threshold_s:g}: must be > 0 (seconds of idle wait)")
    if not threshold_sd >= 0:
        raise _fail(f"--threshold-sd {threshold_sd:g}: must be >= 0")
    if agent_steps < 1:
        raise _fail(f"--agent-steps {agent_steps}: need at least 1 (model calls per prompt)")
    with _user_errors():
        if mode == "live":  # the proxy and the official openai SDK
            from flowtrial.study.extras import require

            require("demo", "flowtrial simulate --mode live")
        from flowtrial.live_simulation import simulate_live
        from flowtrial.study.config import load_study
        from flowtrial.study.simulator.params import SimParams
        from flowtrial.study.simulator.summary import study_glance
        from flowtrial.study.simulator.virtual import new_seed, simulate_virtual
        from flowtrial.study.storage import init_db

        config = load_study(study)
        if agent_steps > 1 and mode == "live" and config.upstream.kind != "mock":
            raise _fail("--mode live --agent-steps needs the simulated model ([upstream] kind "
                        "= \"mock\"): its tool steps make the tool calls")
        if mode == "live":
            from flowtrial.live_simulation import compression_warnings

            for w in compression_warnings(config):
                typer.echo(f"warning: {w}", err=True)
        params = SimParams(truth=truth, threshold_s=threshold_s,  # type: ignore[arg-type]
                           threshold_logsd=threshold_sd, models=_models(model or []),
                           steps_per_task=steps_per_task)
        database = init_db(db, config, study.read_text(encoding="utf-8"))
        seed = new_seed() if seed is None else seed
        console = Console(stderr=True)
        run = simulate_virtual if mode == "virtual" else simulate_live
        total_label = "participants" if mode == "virtual" else "cycles"
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar:
            job = bar.add_task(f"simulating ({mode}, {total_label})", total=None)
            extra = {"agent_steps": agent_steps} if agent_steps > 1 else {}
            res = run(database, config, params, participants, tasks, prompts_per_task, seed,
                      progress=lambda d, t: bar.update(job, completed=d, total=t), **extra)
        glance = study_glance(database)
        database.dispose()
    out = Console()
    out.print(
        f"Simulated {len(res.participants)} participants ({mode}, truth={truth}, "
        f"ψ={threshold_s:g} s, seed={res.seed}): {res.cycles} cycles, {res.events} events, "
        f"{res.tasks} tasks -> {db}", highlight=False)
    rates = ", ".join(
        f"{b['band']} {'—' if b['rate'] is None else format(b['rate'] * 100, '.0f') + ' %'}"
        for b in glance.bands)
    out.print(f"Switch rate by experienced TTFT (whole database): {rates}", highlight=False)


def demo(
    dir: Annotated[Path, typer.Option(
        "--dir", help="Directory for the demo (replaced if it holds an earlier demo).")] = Path(
        "flowtrial-demo"),
    participants: Annotated[int, typer.Option(
        "--participants", help="Number of simulated participants.")] = DEMO_PARTICIPANTS,
    seed: Annotated[int, typer.Option("--seed", help="Seed of study and behaviour.")] = 1,
) -> None:
    """Run a whole latency trial offline in 2–5 minutes: proxy, simulated participants,
    analysis, report."""
    from rich.console import Console

    from flowtrial.demo import run_demo

    if participants < 1:
        raise _fail(f"--participants {participants}: need at least 1")
    with _user_errors():
        result = run_demo(dir, participants, seed, progress=True)
    out = Console()
    for line in result.summary_lines():
        out.print(line, highlight=False, soft_wrap=True)
