"""CLI command functions `analyze` and `power` (registered on `flowtrial` by the lead).

Heavy imports live inside the functions so that `flowtrial --help` stays fast. Bad input
is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer


def _fail(message: str) -> typer.Exit:
    """Print one line on stderr and return the exit-2 exception to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x, fmt)


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):+.1f} %"


def analyze(
    db: Annotated[str, typer.Option("--db", help="Study database: a SQLite path or a URL.")],
    out: Annotated[
        Path, typer.Option("--out", help="Directory for results.json and report.html.")
    ] = Path("flowtrial-report"),
    json_out: Annotated[
        bool, typer.Option("--json", help="Print results.json on stdout (files are written too).")
    ] = False,
    n_boot: Annotated[
        int, typer.Option("--n-boot", help="Bootstrap and null replicates per threshold fit.")
    ] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the bootstraps.")] = 0,
) -> None:
    """Run the preregistered analysis: checks, task-time effect, flow threshold, secondary
    outcomes; write results.json and a self-contained report.html."""
    from flowtrial.study.errors import FlowtrialError

    from . import AnalysisInputError
    from .report import run_analysis

    if n_boot < 10:
        raise _fail(f"--n-boot {n_boot} is too small: use at least 10 (200 for reporting)")
    try:
        results = run_analysis(db, out, n_boot=n_boot, seed=seed, progress=not json_out)
    except (FlowtrialError, AnalysisInputError) as exc:
        raise _fail(str(exc).splitlines()[0]) from None
    if json_out:
        typer.echo(json.dumps(results, indent=2))
        return
    _print_summary(results, out)


def _print_summary(r: dict[str, Any], out: Path) -> None:
    from rich.console import Console

    from .threshold_speed import speed_lines

    console = Console()
    st = r["study"]
    # n_cycles counts the analysis' units of waiting: agent turns where agents made them.
    units = (f"turns={st['n_cycles']} (of {st.get('n_model_calls')} model calls)"
             if st.get("wait_unit") == "turn" else f"cycles={st['n_cycles']}")
    console.print(f"[bold]{st['name']}[/bold]  design={st['design']}  "
                  f"participants={st['n_participants']}  {units}  tasks={st['n_tasks']}")
    for m in r.get("messages", []):
        console.print(f"[yellow]note:[/yellow] {m}")
    srm = r["checks"].get("srm") or {}
    if "flagged" in srm:
        flag = "[red]MISMATCH[/red]" if srm["flagged"] else "[green]ok[/green]"
        console.print(f"Sample-ratio check: p = {_num(srm.get('p_value'))} {flag}")
    manip = r["checks"].get("manipulation") or {}
    if manip.get("summary"):
        color = {"flagged": "red", "warn": "yellow"}.get(manip.get("status", ""), "green")
        console.print(f"[{color}]{manip['summary']}[/{color}]", highlight=False)
        for line in [*manip.get("problems", []), *manip.get("warnings", [])]:
            console.print(f"  {line}", highlight=False)
    elif manip.get("skipped"):
        console.print(f"Manipulation check: not run ({manip['skipped']})")
    t = r["threshold"]
    pt = t.get("personal") or {}
    # The report's banner sentence, word for word (same estimand, numbers, CI and units).
    console.print(t.get("headline") or f"Flow threshold: {t.get('reason')}", highlight=False)
    if t.get("found"):
        tci = pt["tau_ci"]
        console.print(f"  spread τ = {_num(pt['tau'])} (95 % CI {_num(tci[0])}–{_num(tci[1])}, "
                      f"p(τ = 0) = {_num(pt['p_tau_zero'])})")
        for line in speed_lines(pt.get("speed_table") or {}):
            console.print(f"  {line}", highlight=False)
    console.print(f"  existence test p = {_num(t.get('p_exists'))}")
    if t.get("psi_s") is not None:
        ci = t["ci_s"]
        console.print(f"  pooled onset ψ* (secondary) = {_num(t['psi_s'])} s "
                      f"(95 % CI {_num(ci[0])}–{_num(ci[1])} s)")
    e = r["task_effect"]
    contrasts = (r.get("speed_capability") or {}).get("contrasts")
    if contrasts:  # a speed-vs-capability design: its contrasts, not fastest vs slowest
        for c in contrasts:
            if c.get("estimate") is not None:
                console.print(f"Task time, {c['contrast']} ({c['arm']} vs {c['reference']}): "
                              f"{_pct(c['estimate'])} (CR2 clustered 95 % CI "
                              f"{_pct(c['ci'][0])} … {_pct(c['ci'][1])})")
    elif e.get("estimate") is not None:
        ci = (e.get("ci") or {}).get("cluster_cr2") or [None, None]
        console.print(f"Task time, {e['treatment_arm']} vs {e['control_arm']}: "
                      f"{_pct(e['estimate'])} (CR2 clustered 95 % CI "
                      f"{_pct(ci[0])} … {_pct(ci[1])})")
        trend = (e.get("by_arm") or {}).get("trend") or {}
        if trend.get("per_doubling") is not None:
            lo, hi = trend["ci"]
            console.print(f"  trend over {len(e['by_arm']['rows']) + 1} arms: "
                          f"{_pct(trend['per_doubling'])} per doubling of the wait "
                          f"(95 % CI {_pct(lo)} … {_pct(hi)})")
    elif e.get("skipped"):
        console.print(f"Task-time effect: not estimated ({e['skipped']})")
    g = (r.get("ground_truth") or {}).get("comparison")
    if g:
        console.print(f"Ground truth: {g['truth_model']}, true median ψ = "
                      f"{_num(g.get('true_psi_s'))} s, τ = {_num(g.get('true_tau'))}; "
                      f"verdict correct: {g['verdict_correct']}")
    console.print(f"Report: {out / 'report.html'}  (data: {out / 'results.json'})")


def _int_list(value: str, option: str) -> list[int]:
    try:
        items = [int(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError:
        raise _fail(f"{option} {value!r}: give whole numbers separated by commas, "
                    "e.g. 10,20,40") from None
    if not items or any(v < 1 for v in items):
        raise _fail(f"{option} {value!r}: give whole numbers >= 1 separated by commas")
    return items


def power(
    study: Annotated[Path, typer.Option("--study", help="The study file (study.toml).")],
    participants: Annotated[
        str, typer.Option("--participants", help="Participant counts, comma-separated.")
    ] = "10,20,40",
    prompts: Annotated[
        str, typer.Option("--prompts", help="Prompts per participant, comma-separated.")
    ] = "30,60",
    sims: Annotated[int, typer.Option("--sims", help="Simulated studies per cell.")] = 200,
    truth: Annotated[
        str, typer.Option("--truth", help="Truth model: hinge, smooth or flat (null).")
    ] = "hinge",
    threshold_s: Annotated[
        float, typer.Option("--threshold-s", help="True population ψ in seconds of idle wait.")
    ] = 8,
    out: Annotated[Path, typer.Option("--out", help="CSV file for the grid.")] = Path(
        "power.csv"
    ),
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    n_boot: Annotated[
        int, typer.Option("--n-boot", help="Bootstrap and null replicates per fit.")
    ] = 100,
) -> None:
    """Power analysis by simulation: power to detect the flow threshold, CI coverage of the
    true ψ and power of the task-time effect, per participants × prompts cell."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    from flowtrial.study.config import load_study
    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.validation import check_output_file

    from .power import power_grid

    ns = _int_list(participants, "--participants")
    ks = _int_list(prompts, "--prompts")
    if min(ns) < 2:
        raise _fail("--participants: need at least 2 participants per study (they are the "
                    "bootstrap clusters)")
    if sims < 1:
        raise _fail(f"--sims {sims}: need at least 1 simulated study per cell")
    if truth not in ("hinge", "smooth", "flat"):
        raise _fail(f"--truth {truth!r}: use hinge, smooth or flat")
    if not math.isfinite(threshold_s) or threshold_s <= 0:
        raise _fail(f"--threshold-s {threshold_s:g}: must be > 0 seconds")
    if n_boot < 10:
        raise _fail(f"--n-boot {n_boot}: use at least 10")
    try:
        config = load_study(study)
        check_output_file(out, "--out")
    except FlowtrialError as exc:
        raise _fail(str(exc).splitlines()[0]) from None

    console = Console(stderr=True)
    if (n_boot + 1) * 0.05 <= 1:
        console.print(f"[yellow]note:[/yellow] with --n-boot {n_boot} the existence test cannot "
                      "reach p < 0.05: every cell will show power 0 (use >= 100)")
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("simulated studies", total=len(ns) * len(ks) * sims)
        grid = power_grid(config, ns, ks, sims, truth=truth, threshold_s=threshold_s,
                          seed=seed, n_boot=n_boot,
                          progress=lambda done, _total: bar.update(task, completed=done))
    out.parent.mkdir(parents=True, exist_ok=True)
    grid.to_csv(out, index=False)

    table = Table(title=f"Power ({truth} truth, ψ = {threshold_s:g} s, {sims} simulated "
                        "studies per cell)")
    for col in ("participants", "prompts", "P(threshold found)", "CI coverage", "median ψ",
                "power (task time)"):
        table.add_column(col, justify="right")
    for row in grid.itertuples():
        table.add_row(
            str(row.participants),
            str(row.prompts) if row.prompts == row.prompts_simulated
            else f"{row.prompts_simulated} (asked {row.prompts})",
            f"{row.power_threshold:.2f} ({row.power_threshold_ci_lo:.2f}–"
            f"{row.power_threshold_ci_hi:.2f})",
            _num(row.ci_coverage, ".2f"), _num(row.median_psi_s, ".3g"),
            _num(row.power_effect, ".2f"),
        )
    Console().print(table)
    Console().print(f"Wrote {out}")
