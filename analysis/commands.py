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

    Effect exp(β) − 1; 95 % CIs: non-robust, HC3, participant-clustered; mixed-model row.
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
        "nonrobust": "OLS, non-robust SE",
        "hc3": "OLS, HC3 SE",
        "cluster": "OLS, clustered SE",
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
    if result.imputed:
        notes.append(f"{result.imputed} missing time value(s) imputed by arm mean")
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
    n_boot: Annotated[int, typer.Option(help="Participant-cluster bootstrap replicates.")] = 200,
    n_null: Annotated[
        int, typer.Option(help="Parametric-bootstrap replicates under the null.")
    ] = 200,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    median_tokens: Annotated[
        float | None, typer.Option(help="Median response length (tokens) for the tokens/s figure.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Estimate the flow threshold ψ: hinge logistic of P(switch) on log wait
    (docs/concepts/analysis.md)."""
    from . import AnalysisInputError
    from .threshold import fit_threshold

    df = _read_csv(file)
    missing = [c for c in (wait, switched, participant) if c not in df.columns]
    if missing:
        raise _fail(f"column(s) {', '.join(missing)} not found in {file}; check the names")
    frame = df.rename(columns={wait: "wait_s", switched: "switched", participant: "participant_id"})
    try:
        result = fit_threshold(
            frame, n_boot=n_boot, n_null=n_null, seed=seed, median_response_tokens=median_tokens
        )
    except AnalysisInputError as exc:
        raise _fail(str(exc)) from None
    if json_out:
        typer.echo(json.dumps(result.to_dict()))
        return
    from rich.console import Console

    console = Console()
    if result.found:
        console.print(
            f"Threshold ψ = {result.psi_s:.2f} s (95 % CI {result.ci_s[0]:.2f}–"
            f"{result.ci_s[1]:.2f} s), p_exists = {result.p_exists:.3g}"
        )
        if result.tokens_per_second_at_median_length is not None:
            console.print(
                f"≈ {result.tokens_per_second_at_median_length:.1f} tokens/s at "
                f"{median_tokens:g} tokens"
            )
    else:
        console.print(result.reason)
    for model in ("flat", "smooth", "hinge"):
        console.print(f"  {model:6s} AIC {result.aic[model]:.1f}  BIC {result.bic[model]:.1f}")
    console.print(f"model choice: {result.model_choice}")


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
    import importlib.util
    import os
    import subprocess
    import sys

    from .notebook_db import ENV_VAR, find_demo_database

    if importlib.util.find_spec("jupyterlab") is None:
        raise ModuleNotFoundError("No module named 'jupyterlab'", name="jupyterlab")
    folder = Path(__file__).resolve().parent / "notebooks"
    if db is None:
        found = find_demo_database(Path.cwd(), folder)
        if found is None:
            raise _fail("no study database: pass --db FILE, or run `flowtrial demo` here first "
                        f"(looked for flowtrial-demo/flowtrial.db in {Path.cwd()} and above)")
        db = str(found)
    elif "://" not in db:
        if not Path(db).is_file():
            raise _fail(f"{db}: no such database; pass a study database made by flowtrial")
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
    process = subprocess.Popen(command, env=env)
    while True:
        try:
            code = process.wait()
            break
        except KeyboardInterrupt:
            # Jupyter got the same Ctrl-C: it asks to confirm, or stops on a second one.
            # Wait for it, so that this command never leaves a server running behind it.
            continue
    raise typer.Exit(code)
