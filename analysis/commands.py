"""CLI command functions of the analysis package (registered on `flowtrial` by the lead).

Heavy imports (pandas, statsmodels) live inside the functions so that `flowtrial --help`
stays fast.
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


def _read_csv(file: Path) -> Any:
    import pandas as pd

    if not file.is_file():
        raise _fail(f"{file}: no such file; give the path of a CSV file")
    try:
        return pd.read_csv(file)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail(f"{file}: cannot read as CSV ({first})") from None


def _pct(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x * 100:+.1f} %"


def effect(
    file: Annotated[Path, typer.Argument(help="CSV with one row per task/issue.")],
    time: Annotated[
        str,
        typer.Option(help="Time column, or columns joined by '+' that are summed (a+b)."),
    ],
    treatment: Annotated[str, typer.Option(help="0/1 arm column (1 = treatment).")],
    forecast: Annotated[
        str | None, typer.Option(help="Pre-randomization time forecast column (log covariate).")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help="Participant column for clustered SEs and the mixed model.")
    ] = None,
    impute: Annotated[
        str, typer.Option(help="Missing time components: 'drop' rows or 'arm_mean' imputation.")
    ] = "drop",
    participant_fe: Annotated[
        bool, typer.Option("--participant-fe", help="Add participant fixed effects.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Estimate the task-time effect (METR-style): OLS of log time on arm + log forecast.

    Effect exp(β) − 1; 95 % CIs: CR2 participant-clustered with a Satterthwaite
    (Bell–McCaffrey) t critical value (default), and the METR-parity rows (non-robust, HC3,
    clustered with METR's normal critical value); mixed model.
    """
    from . import AnalysisInputError
    from .effects import estimate_effect

    df = _read_csv(file)
    try:
        result = estimate_effect(
            df,
            time=time,
            treatment=treatment,
            forecast=forecast,
            cluster=cluster,
            impute=impute,  # type: ignore[arg-type]  # validated inside
            participant_fe=participant_fe,
        )
    except AnalysisInputError as exc:
        raise _fail(str(exc)) from None
    data = result.to_dict()
    if json_out:
        typer.echo(json.dumps(data))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Task-time effect of {treatment} (n = {result.n})")
    for col in ("model", "effect", "95 % CI", "p"):
        table.add_column(col, justify="left" if col == "model" else "right")
    labels = {
        "cluster_cr2": "OLS, CR2 clustered SE, Satterthwaite t (default)",
        "nonrobust": "OLS, non-robust SE (METR parity)",
        "hc3": "OLS, HC3 SE (METR parity)",
        "cluster": "OLS, clustered SE, normal (METR parity)",
    }
    for key, label in labels.items():
        ci = data["ci"][key]
        if ci is None:
            table.add_row(label, "—", "(no --cluster)", "—")
            continue
        table.add_row(
            label, _pct(data["estimate"]), f"{_pct(ci[0])} … {_pct(ci[1])}", f"{data['p'][key]:.3g}"
        )
    mixed = data["mixed"]
    if mixed is None:
        table.add_row("mixed (random intercept)", "—", "(no --cluster)", "—")
    elif mixed["ci"] is None:
        table.add_row("mixed (random intercept)", "—", f"failed: {mixed['error']}", "—")
    else:
        table.add_row(
            "mixed (random intercept)",
            _pct(mixed["estimate"]),
            f"{_pct(mixed['ci'][0])} … {_pct(mixed['ci'][1])}",
            f"{mixed['p']:.3g}",
        )
    console = Console()
    console.print(table)
    notes = []
    if result.imputation_note:
        notes.append(result.imputation_note)
    if result.dropped:
        notes.append(f"{result.dropped} row(s) dropped for missing values")
    if notes:
        console.print("; ".join(notes))


def threshold(
    file: Annotated[Path, typer.Argument(help="CSV with one row per cycle.")],
    wait: Annotated[str, typer.Option(help="Wait column in seconds (> 0).")] = "wait_s",
    switched: Annotated[str, typer.Option(help="0/1 column: context switch during the wait.")] = (
        "switched"
    ),
    participant: Annotated[str, typer.Option(help="Participant column.")] = "participant_id",
    n_boot: Annotated[int, typer.Option(help="Participant-cluster bootstrap replicates (ψ*).")]
    = 200,
    n_null: Annotated[
        int, typer.Option(help="Parametric-bootstrap replicates of the existence test.")
    ] = 200,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    tokens: Annotated[str, typer.Option(
        help="Answer-length column (tokens) for what a model speed means: the share of these "
             "answers whose idle wait would exceed the threshold at 50-3,000 tokens/s "
             "(used when present).")] = "tokens_completion",
    reading_tps: Annotated[
        float, typer.Option(help="Reading speed (tokens/s) of the idle wait, for that table.")
    ] = 5.3,
    detection_share: Annotated[
        float, typer.Option(help="Share of real switches the switch rule counts (0-1].")
    ] = 1.0,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes (default: the available CPUs, up to 2).")
    ] = None,
    gradual_onsets: Annotated[bool | None, typer.Option(
        "--gradual-onsets/--no-gradual-onsets",
        help="Test against gradual onsets too (an onset rounded over more than a factor 9 "
             "of the wait, an S-curve whose lower bend spans as much, a rise ever steeper in "
             "the wait in seconds): a sharp threshold, not a gradual onset. Default: from 9,600 "
             "cycles on (60 × 160); at 30 × 80 the two could not be told apart.",
        show_default=False)] = None,
    all_intervals: Annotated[bool, typer.Option(
        "--all-intervals",
        help="Compute the profile CIs of the median threshold and τ even when the test finds "
             "no threshold (by default only for a threshold it supports: they are the "
             "slowest refits).")] = False,
    quadrature: Annotated[str, typer.Option(
        help="The personal fit's quadrature: 'adaptive' (each person's nodes centred on "
             "their posterior) or 'plain' (one grid for everyone: faster, but with many "
             "cycles per person, 160-200 measured, it misses narrow posteriors and, where "
             "people's slopes differ, pulls the median threshold up).")] = "adaptive",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Estimate the flow threshold: the median personal threshold and the spread τ between
    people (random-breakpoint hinge logistic of P(switch) on log wait), the existence test,
    and the pooled onset ψ* as a secondary figure (docs/concepts/analysis.md).

    It reports a threshold only if it beats the best no-threshold model, and every one that
    fits almost as well (parametric bootstrap)."""
    import numpy as np

    from . import AnalysisInputError
    from .threshold import fit_threshold
    from .threshold_speed import exceedance_table
    from .threshold_verdict import personal_verdict

    df = _read_csv(file)
    missing = [c for c in (wait, switched, participant) if c not in df.columns]
    if missing:
        raise _fail(f"column(s) {', '.join(missing)} not found in {file}; check the names")
    if not 0 < detection_share <= 1:
        raise _fail(f"--detection-share {detection_share:g}: give a share in (0, 1]")
    if not 1 <= reading_tps <= 50:
        raise _fail(f"--reading-tps {reading_tps:g}: give a reading speed in 1-50 tokens/s")
    if quadrature not in ("plain", "adaptive"):
        raise _fail(f"--quadrature {quadrature}: give plain or adaptive")
    frame = df.rename(columns={wait: "wait_s", switched: "switched", participant: "participant_id"})
    try:
        pooled = fit_threshold(frame, n_boot=n_boot, n_null=n_null, seed=seed)
        personal, test = _fit_personal(frame, detection_share, workers, seed,
                                       show=not json_out, onsets=gradual_onsets,
                                       intervals=all_intervals, quadrature=quadrature)
    except AnalysisInputError as exc:
        raise _fail(str(exc)) from None
    pooled_d = pooled.to_dict()
    pers = personal.to_dict()
    test_d = test.to_dict()
    waits = frame["wait_s"].to_numpy(float)
    found, reason = personal_verdict(pers, pooled_d, waits[np.isfinite(waits) & (waits > 0)],
                                     test=test_d)
    speed = exceedance_table(personal.median_psi_s, personal.ci_s,
                             df[tokens] if tokens in df.columns else [], found=found,
                             reading_tps=reading_tps)
    if json_out:
        typer.echo(json.dumps({"found": found, "reason": reason, "personal": pers,
                               "alternatives": test_d, "speed_table": speed,
                               "pooled": pooled_d}))
        return
    _print_threshold(personal, test, pooled, found, reason, speed)


def _print_threshold(p: Any, test: Any, pooled: Any, found: bool, reason: str | None,
                     speed: dict[str, Any]) -> None:
    """`flowtrial threshold`'s text: the personal threshold, the test, the verdict, the model
    speeds (for a threshold it reports) and the pooled onset."""
    from rich.console import Console

    from .threshold_speed import speed_lines
    from .threshold_verdict import replicates_text

    console = Console()
    console.print(
        f"Median personal threshold e^c = [bold]{p.median_psi_s:.2f} s[/bold] (95 % CI "
        f"{_interval(p.ci_s, ' s')}); spread τ = {p.tau:.2f} (95 % CI {_interval(p.tau_ci)}; "
        f"test of τ = 0: p = {p.p_tau_zero:.3g})")
    console.print(f"Threshold vs best no-threshold model ({test.label}): "
                  f"p = {test.p_value:.3g} (parametric bootstrap, "
                  f"{replicates_text(test.to_dict())})")
    if len(test.components) > 1:  # the alternatives near the best, each tested
        console.print("  each alternative near the best: " + ", ".join(
            f"{kind} p = {p:.3g}" for kind, p in test.components.items()), highlight=False)
    console.print(f"Existence test: p = {pooled.p_exists:.3g}. "
                  + ("Threshold found." if found else str(reason)))
    if found:
        for line in speed_lines(speed):
            console.print(f"  {line}", highlight=False)
    console.print(f"Pooled onset ψ* (secondary) = {pooled.psi_s:.2f} s (95 % CI "
                  f"{pooled.ci_s[0]:.2f}–{pooled.ci_s[1]:.2f} s)")
    for model in ("flat", "smooth", "hinge_tau0", "hinge"):
        console.print(f"  {model:10s} AIC {p.aic[model]:.1f}  BIC {p.bic[model]:.1f}")


def _interval(bounds: list[float] | None, unit: str = "") -> str:
    """"1.28–8.66 s", or why there is none (the CIs are computed only for a threshold the
    test supports)."""
    if bounds is None:
        return "not computed: no threshold to bound"
    return f"{bounds[0]:.2f}–{bounds[1]:.2f}{unit}"


def _fit_personal(frame: Any, detection_share: float, workers: int | None, seed: int,
                  show: bool, onsets: bool | None = None, intervals: bool = False,
                  quadrature: str = "adaptive") -> Any:
    """`fit_personal_and_test` (personal threshold + the test against the no-threshold
    alternatives) with a rich progress bar on stderr (unless ``show`` is off)."""
    from .threshold_verdict import fit_personal_and_test

    if not show:
        return fit_personal_and_test(frame, detection_share=detection_share, workers=workers,
                                     seed=seed, onsets=onsets, intervals=intervals,
                                     quadrature=quadrature)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("personal threshold: refits", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return fit_personal_and_test(frame, detection_share=detection_share, workers=workers,
                                     seed=seed, progress=advance, onsets=onsets,
                                     intervals=intervals, quadrature=quadrature)


def notebooks(
    db: Annotated[str | None, typer.Option(
        "--db", help="Study database the notebooks read (a SQLite path or a SQLAlchemy URL; "
        "default: the demo's flowtrial-demo/flowtrial.db, here or in a folder above).")] = None,
    port: Annotated[int, typer.Option(
        "--port", help="Port for Jupyter (a nearby free one if it is taken).")] = 8888,
    no_browser: Annotated[bool, typer.Option(
        "--no-browser", help="Do not open a browser; print the URL only.")] = False,
) -> None:
    """Open the analysis notebooks (task effects, flow threshold, power) in JupyterLab on a
    study database."""
    import os
    import signal
    import sys

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.extras import require
    from flowtrial.study.processes import run_child

    from .notebook_db import ENV_VAR, find_demo_database

    try:
        require("notebooks", "flowtrial notebooks")
    except FlowtrialError as exc:
        raise _fail(str(exc)) from None
    folder = Path(__file__).resolve().parent / "notebooks"
    if db is None:
        found = find_demo_database(Path.cwd(), folder)
        if found is None:
            raise _fail("no study database: pass --db FILE, or run `flowtrial demo` here first "
                        f"(looked for flowtrial-demo/flowtrial.db in {Path.cwd()} and above)")
        db = str(found)
    else:
        from flowtrial.study.storage import open_db

        open_db(db).dispose()  # a missing or foreign database: one line, before Jupyter starts
        if "://" not in db:
            db = str(Path(db).resolve())  # Jupyter runs in the notebooks' folder
    typer.echo(f"Notebooks in {folder}, reading {db}. Ctrl-C stops Jupyter.")
    env = {**os.environ, ENV_VAR: db}
    command = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               # Nothing but loopback: no news feed, no update check, no PyPI extension search.
               "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly"]
    if no_browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Containers often run as root, which Jupyter refuses unless told; it still listens
        # on 127.0.0.1 only.
        command.append("--ServerApp.allow_root=True")
    # Ctrl-C reaches Jupyter too, which would ask to confirm; SIGTERM stops it without asking,
    # and run_child waits for it, so this command never leaves a server behind.
    code = run_child(command, env, translate={signal.SIGINT: signal.SIGTERM})
    raise typer.Exit(code)
