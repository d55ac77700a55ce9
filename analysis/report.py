"""`flowtrial analyze`: the preregistered analysis of a study database (docs/concepts/analysis.md).

``run_analysis`` reads the database through the metrics layer (``flowtrial.analysis.metrics``), then
runs, in this order:

1. **checks** — sample-ratio mismatch, carry-over (crossover), manipulation check per arm,
   missing data per arm;
2. **task-time effect** — METR-style ``estimate_effect`` (fast arm = treatment, log
   ``forecast_slow_s`` as the forecast), when tasks span two arms;
3. **flow threshold** — the headline is the median personal threshold and the spread τ
   between people (``fit_personal_threshold``, random-breakpoint model, on idle wait at the
   study's ``[analysis] reading_tps``); the pooled onset ψ* (``fit_threshold``) is a
   secondary row and carries the existence test; sensitivity rows (pooled ψ*, estimate and
   CI): total wait, experienced TTFT, reading ×0.7 / ×1.4, and the switch definition at the
   other sensitivity thresholds;
4. **secondary outcomes** — resumption lag, cycles per hour, acceptance, persistence,
   review time, by arm and by wait band;
5. **ground truth** (simulated studies) — true ψ against the estimate.

It writes ``results.json`` and a self-contained ``report.html`` (figures embedded as PNG).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.provenance import provenance
from flowtrial.study.randomization import srm_not_applicable

from . import AnalysisInputError, task_outcomes
from . import report_figures as figs
from .agent_telemetry import agent_section, read_agent_events
from .metrics import (
    StudyFrames,
    cycle_table_from_frames,
    read_frames,
    task_table_from_frames,
)
from .report_sections import (
    WAIT_BANDS_S,
    WAIT_MEASURES,
    compare_truth,
    expected_wait_s,
    ground_truth,
    jsonable,
    order_arms,
    per_person_curves,
    personal_section,
    secondary_outcomes,
    threshold_headline,
    threshold_section,
)
from .switches import switch_column
from .turn_telemetry import events_by_turn, read_turn_inputs, turn_section, turn_table
from .workers import run_jobs

PRIMARY_WAIT = "idle_wait_s"
SENSITIVITY_WAITS = ("total_wait_s", "experienced_ttft_s")
MIN_CYCLES = 20  # below this, the report says there is too little data for wait analyses


# ------------------------------------------------------------------------------- checks


def _wait_unit(cycles: Any) -> dict[str, Any]:
    """Which unit of waiting the analysis used (cycle or agent turn) and what it set aside."""
    unit = cycles.attrs.get("wait_unit")
    if unit is None:
        return {"wait_unit": "cycle", "wait_unit_note": None}
    return {"wait_unit": unit["unit"], "n_model_calls": unit["cycles"],
            "side_calls_set_aside": unit["side_calls"],
            "retries_merged": unit["retries"], "wait_unit_note": unit["note"]}


def checks_section(
    config: Any, frames: StudyFrames, cycles: pd.DataFrame, tasks: pd.DataFrame
) -> dict[str, Any]:
    """Checks first (docs/concepts/analysis.md#checks-first), with ``flowtrial.analysis.checks``; a
    check that does not apply or cannot run says why in ``skipped``."""
    from . import checks

    def run(fn: Callable[[], Any]) -> dict[str, Any]:
        try:
            return fn().to_dict()
        except AnalysisInputError as exc:
            return {"skipped": str(exc)}

    design = config.study.design
    planned = {a.name: a.weight for a in config.allocated_arms}
    assign = frames.extra.get("assignments")
    out: dict[str, Any] = {}
    if design == "parallel" and len(planned) > 1 and assign is not None:
        observed = assign["arm"].astype(str).value_counts().to_dict()
        out["srm"] = {**run(lambda: checks.srm_check(observed, planned)),
                      "unit": "participants"}
    elif design == "crossover" and len(planned) > 1:
        # Every arm should get an equal share of the participant-periods. Cycles would be
        # the wrong unit: clustered within people, and their number depends on the latency.
        periods = (tasks if len(tasks) and "period" in tasks.columns else cycles)
        units = periods.dropna(subset=["period", "arm"]).drop_duplicates(
            ["participant_id", "period"])
        observed = units["arm"].astype(str).value_counts().to_dict()
        out["srm"] = {**run(lambda: checks.srm_check(observed, dict.fromkeys(planned, 1.0))),
                      "unit": "participant-periods"}
    else:
        out["srm"] = {"skipped": srm_not_applicable(config)
                      or "no assignments recorded: no allocation ratio to check"}
    if design == "crossover":
        out["carryover"] = run(lambda: checks.carryover_check(tasks))
    else:
        out["carryover"] = {"skipped": f"{design} design: no periods to carry over"}
    # Per model call on the raw rows (applied targets, upstream arrival times), not per turn.
    out["manipulation"] = run(lambda: checks.manipulation_check(
        frames.cycles, time_scale=frames.time_scale, model_speed=frames.model_speed,
        precision_ms=config.study.precision_ms))
    # Missing data per arm: cycle outcomes (a missing decision is a cycle nobody answered),
    # and task times and forecasts.
    cyc = cycles.assign(decision=cycles["decision"].where(cycles["decision"] != "none"))
    parts = {"cycles": run(lambda: checks.missing_data(
        cyc, columns=["total_wait_s", "experienced_ttft_s", "tokens_completion", "decision"],
        cluster="participant_id"))}
    if len(tasks):
        parts["tasks"] = run(lambda: checks.missing_data(
            tasks, columns=["task_time_s", "forecast_fast_s", "forecast_slow_s"],
            cluster="participant_id" if "participant_id" in tasks.columns else None))
    out["missing_data"] = parts
    return out


# -------------------------------------------------------------------------- task effect


def task_effect_section(config: Any, tasks: pd.DataFrame, median_tokens: float) -> dict[str, Any]:
    """METR-style effect of the fast arm on log task time (forecast: log forecast_slow_s)."""
    from .effects import estimate_effect

    if config.study.design == "per_prompt":
        return {"skipped": "per-prompt design: latency is randomized per request, not per "
                           "task, so there is no task-time contrast between arms"}
    if tasks.empty:
        return {"skipped": "no tasks in this study"}
    t = tasks[np.isfinite(tasks["task_time_s"].to_numpy(float))
              & (tasks["task_time_s"].to_numpy(float) > 0) & tasks["arm"].notna()]
    arms = order_arms(config, sorted(t["arm"].astype(str).unique()), median_tokens)
    if len(arms) < 2:
        return {"skipped": "tasks with a time in at least two arms are needed "
                           f"(found {len(arms)} arm(s) with timed tasks)"}
    fast, slow = arms[0], arms[-1]
    t = t.assign(arm=t["arm"].astype(str))
    t = t[t["arm"].isin(arms)].assign(treatment=lambda d: (d["arm"] == fast).astype(int))
    has_fc = t["forecast_slow_s"].notna().any()
    forecast = "forecast_slow_s" if has_fc else None
    # Crossover: periods differ (learning, fatigue) and arms are balanced over them only in
    # expectation, so the model has period fixed effects.
    period = (config.study.design == "crossover" and "period" in t.columns
              and t["period"].nunique() > 1)
    covariates = ["period"] if period else []
    by_arm = None
    if len(arms) > 2:
        # Every arm in one model: the headline (fastest vs slowest) keeps the middle arms'
        # tasks, each under its own dummy, and every arm gets its row against the slowest.
        from .arm_effects import arm_effects

        waits = {a.name: expected_wait_s(a, median_tokens) for a in config.arms}
        by_arm = arm_effects(t, arms, waits, forecast=forecast, covariates=covariates)
        t = t.assign(other_arm=t["arm"].where(~t["arm"].isin([fast, slow]), ""))
        covariates = ["other_arm", *covariates]
    note = None if by_arm is None else (
        f"{len(arms)} arms: the headline is the fastest ({fast}) against the slowest ({slow}) "
        "with the other arms in the same model; every arm's row and the trend over speed "
        "follow")
    try:
        res = estimate_effect(
            t, time="task_time_s", treatment="treatment", forecast=forecast,
            cluster="participant_id", impute="drop", covariates=covariates or None,
        )
    except AnalysisInputError as exc:
        return {"skipped": str(exc), "treatment_arm": fast, "control_arm": slow}
    d = res.to_dict()
    d.update({"treatment_arm": fast, "control_arm": slow, "note": note, "by_arm": by_arm,
              "forecast": forecast,
              "interpretation": "relative change in task time with the fast arm: "
                                "exp(β) − 1 (negative = faster)"})
    return d


# ----------------------------------------------------------------------------- analysis


def _say(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda _msg: None
    from rich.console import Console

    console = Console(stderr=True)
    start = time.perf_counter()
    return lambda msg: console.print(f"[dim]{time.perf_counter() - start:5.1f}s[/dim] {msg}")


def run_analysis(
    db_path: str | Path,
    out_dir: str | Path | None,
    *,
    n_boot: int = 200,
    seed: int = 0,
    progress: bool = False,
    figures: bool = True,
    workers: int | None = None,
) -> dict[str, Any]:
    """Analyse the study database at ``db_path``; write ``results.json`` and ``report.html``
    into ``out_dir`` (nothing is written when it is None). Returns the results dict.

    ``n_boot`` is used for both the bootstrap CI and the existence test of every threshold
    fit. ``workers`` (default: up to 2 CPUs) processes share the threshold fits while this
    process draws the figures that do not depend on them.

    Raises ``flowtrial.study.storage.StorageError`` for a missing/foreign database and
    ``AnalysisInputError`` when there is nothing to analyse (no cycles and no tasks).
    """
    from flowtrial.study.storage import open_db
    from flowtrial.study.validation import check_output_dir

    if out_dir is not None:  # before the analysis: a bad --out must not cost its minutes
        check_output_dir(Path(out_dir), "--out")
    say = _say(progress)
    database = open_db(db_path)
    try:
        config = database.config()
        frames = read_frames(database)
        say(f"read {len(frames.cycles)} cycles, {len(frames.events)} events, "
            f"{len(frames.tasks)} tasks")
        truth = ground_truth(database)
        agent_events = read_agent_events(database)
        turn_inputs = read_turn_inputs(database)
    finally:
        database.dispose()
    cycles = cycle_table_from_frames(frames)
    tasks = task_table_from_frames(frames)
    if cycles.empty and tasks.empty:
        raise AnalysisInputError(
            f"{db_path}: the study has no cycles and no tasks yet: point participants' "
            "assistants at the proxy (or run `flowtrial simulate`) before analysing"
        )
    say("metrics tables built")
    draw = figures and out_dir is not None
    fig_uris: dict[str, str | None] = {}

    def other_figures() -> None:
        fig_uris.update(_independent_figures(cycles, truth, seed))
        say("figures drawn")

    results, fit = analyse_tables(config, frames, cycles, tasks, truth, n_boot=n_boot,
                                  seed=seed, say=say, workers=workers,
                                  while_fitting=other_figures if draw else None)
    results["study"]["database"] = str(db_path)
    results["agent_telemetry"] = agent_section(cycles, agent_events, PRIMARY_WAIT,
                                               WAIT_BANDS_S, frames.time_scale)
    tev, tturns, tcycles = turn_inputs
    results["agent_turns"] = turn_section(
        turn_table(events_by_turn(tev, tturns, tcycles), tturns, tcycles, frames.time_scale),
        WAIT_BANDS_S, len(tturns))
    if draw:
        fig_uris.update(_fit_figures(cycles, truth, fit, results["threshold"]))
    results["figures"] = sorted(k for k, v in fig_uris.items() if v)
    results = jsonable(results)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        (out / "report.html").write_text(render_html(results, fig_uris), encoding="utf-8")
        say(f"wrote {out / 'results.json'} and {out / 'report.html'}")
    return results


def analyse_tables(config: Any, frames: StudyFrames, cycles: pd.DataFrame, tasks: pd.DataFrame,
                   truth: dict[str, Any] | None, *, n_boot: int = 200, seed: int = 0,
                   say: Callable[[str], None] = lambda _m: None, workers: int | None = 1,
                   while_fitting: Callable[[], None] | None = None,
                   ) -> tuple[dict[str, Any], Any]:
    """Every section of the analysis on already-built metrics tables (no files).

    Returns (results, the primary ``ThresholdResult`` or None, for figures).
    ``while_fitting`` runs in this process while worker processes fit the thresholds."""
    scale = frames.time_scale
    switch_col = "switched"
    ok = cycles[(cycles["status"].astype(str) == "ok").to_numpy()]
    tok = ok["tokens_completion"].dropna()
    median_tokens = float(tok.median()) if len(tok) else None
    messages: list[str] = []
    if scale != 1:
        messages.append(
            f"This study ran with time compressed {scale:g}× (time_scale = {scale:g}); every "
            "duration and rate in this report was converted back to real seconds."
        )
    if (n_boot + 1) * 0.05 <= 1:
        messages.append(f"With {n_boot} null replicates the existence test cannot reach "
                        "p < 0.05, so no threshold can be reported: use --n-boot 200.")
    if len(ok) < MIN_CYCLES:
        messages.append(f"Only {len(ok)} completed cycle(s): too few for the wait analyses "
                        f"(need at least {MIN_CYCLES}).")
    results: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "study": {
            "name": config.study.name, "design": config.study.design,
            "unit": config.study.unit, "time_scale": scale, "time_compressed": scale != 1,
            "arms": [a.name for a in config.allocated_arms],
            "n_participants": int(cycles["participant_id"].nunique()),
            "n_cycles": int(len(cycles)), "n_cycles_ok": int(len(ok)),
            "n_tasks": int(len(tasks)),
            "switch_min_away_s": frames.switch_min_away_s,
            "idle_limit_s": frames.idle_limit_s,
            "median_response_tokens": median_tokens,
            **_wait_unit(cycles),
            **provenance(config),
        },
        "wait_measure": PRIMARY_WAIT,
        "wait_measure_label": WAIT_MEASURES[PRIMARY_WAIT],
        "messages": messages,
    }
    results["checks"] = checks_section(config, frames, cycles, tasks)
    say("checks done")
    results["task_effect"] = task_effect_section(config, tasks, median_tokens or 300.0)
    results["task_post_review"] = task_outcomes.post_review_section(
        config, tasks, median_tokens or 300.0)
    say("task-time effect done")
    if any(a.matched_to for a in config.arms):
        from .speed_capability import speed_capability_section

        served = None
        if "model" in frames.cycles.columns:  # the model served: the arm's, else the client's
            c = frames.cycles
            served = pd.DataFrame({"arm": c["arm"], "model": c["served_model"].fillna(c["model"])
                                   if "served_model" in c.columns else c["model"],
                                   "turn_id": c.get("turn_id"), "tool_calls": c.get("tool_calls")})
        results["speed_capability"] = speed_capability_section(
            config, tasks, cycles, served,
            truth=((truth or {}).get("params") or {}).get("speed_capability"))

    reading = float(frames.reading_tps)
    results["study"]["reading_tps"] = reading
    cycles = _with_reading_sensitivity(cycles, reading)
    jobs = [(PRIMARY_WAIT, switch_col)] + [(w, switch_col) for w in SENSITIVITY_WAITS]
    jobs += [(reading_column(r), switch_col) for r in reading_alternatives(reading)]
    for m in sorted({2.0, 30.0, *frames.switch_sensitivity_s} - {frames.switch_min_away_s}):
        if switch_column(m) in cycles.columns:
            jobs.append((PRIMARY_WAIT, switch_column(m)))
    fits = _fit_thresholds(cycles, jobs, n_boot=n_boot, seed=seed, workers=workers,
                           while_fitting=while_fitting)
    thr, res = fits[0]
    sens = [_sens_row(row) for row, _ in fits[1:]]
    say(f"pooled onset ψ* and {len(sens)} sensitivity fits done")
    # The headline: the median personal threshold and the spread between people.
    shortest = min({2.0, *frames.switch_sensitivity_s})
    personal = personal_section(
        cycles, PRIMARY_WAIT, switch_col, thr, reading_tps=reading,
        all_switch_col=switch_column(shortest) if shortest < frames.switch_min_away_s else None,
        workers=workers,
        progress=lambda done, total: say(f"personal threshold: {done}/{total} refits"))
    thr = {**thr, "pooled_found": thr.get("found"), "pooled_reason": thr.get("reason"),
           "personal": personal, "found": bool(personal.get("found")),
           "reason": personal.get("reason")}
    thr["headline"] = threshold_headline(thr, WAIT_MEASURES[PRIMARY_WAIT])
    results["threshold"] = thr
    results["threshold_sensitivity"] = sens
    results["threshold_sensitivity_note"] = (
        f"{len(sens)} sensitivity analyses of the pooled onset ψ*, each with its own 95 % CI "
        f"and existence test at 0.05: about {0.05 * len(sens):.2g} of them would reject by "
        f"chance under no effect (Bonferroni level {0.05 / max(len(sens), 1):.2g}); they "
        "describe robustness and confirm nothing on their own.")
    results["secondary"] = secondary_outcomes(cycles, PRIMARY_WAIT, switch_col)
    results["per_person_curves"] = per_person_curves(cycles, PRIMARY_WAIT)
    if truth is not None:
        waits = cycles.loc[cycles["status"] == "ok", PRIMARY_WAIT]
        results["ground_truth"] = {**truth, "comparison": compare_truth(truth, thr, waits)}
    else:
        results["ground_truth"] = None
    return results, res


def reading_alternatives(reading_tps: float) -> list[float]:
    """Reading speeds of the sensitivity rows: a slow and a fast reader (×0.7, ×1.4)."""
    return [round(reading_tps * 0.7, 2), round(reading_tps * 1.4, 2)]


def reading_column(reading_tps: float) -> str:
    """Column of the idle wait at another reading speed, e.g. ``idle_wait_at_3.71tps_s``."""
    return f"idle_wait_at_{reading_tps:g}tps_s"


def _with_reading_sensitivity(cycles: pd.DataFrame, reading_tps: float) -> pd.DataFrame:
    """Add the idle wait at the sensitivity reading speeds (`reading_alternatives`)."""
    from flowtrial.study.timeline import idle_wait_s

    out = cycles.copy()
    ok = np.isfinite(out[PRIMARY_WAIT].to_numpy(float))
    tok = np.nan_to_num(pd.to_numeric(out["tokens_completion"], errors="coerce")
                        .to_numpy(float))
    for r in reading_alternatives(reading_tps):
        w = idle_wait_s(out["experienced_ttft_s"].to_numpy(float), tok,
                        out["achieved_tps"].to_numpy(float), r)
        out[reading_column(r)] = np.where(ok, w, np.nan)
    return out


def _fit_thresholds(cycles: pd.DataFrame, jobs: list[tuple[str, str]], *, n_boot: int,
                    seed: int, workers: int | None,
                    while_fitting: Callable[[], None] | None = None,
                    ) -> list[tuple[dict[str, Any], Any]]:
    """``threshold_section`` for each (wait, switch) job, on worker processes
    (``flowtrial.analysis.workers``); every fit is seeded, so results do not depend on the
    workers."""
    cols = sorted({"participant_id", "status", *(c for job in jobs for c in job),
                   *({"switch_source"} & set(cycles.columns))})
    narrow = cycles[cols]
    return run_jobs(_fit_job, [(narrow, w, sw, n_boot, seed) for w, sw in jobs], workers,
                    while_waiting=while_fitting)


def _fit_job(cycles: pd.DataFrame, wait: str, switch: str, n_boot: int, seed: int
             ) -> tuple[dict[str, Any], Any]:
    return threshold_section(cycles, wait, switch, n_boot=n_boot, seed=seed)


def _sens_row(row: dict[str, Any]) -> dict[str, Any]:
    keys = ["wait_measure", "wait_measure_label", "switch_measure", "n_cycles", "psi_s", "ci_s",
            "p_exists", "lr_stat", "model_choice", "found", "reason"]
    return {k: row.get(k) for k in keys}


def _independent_figures(cycles: pd.DataFrame, truth: dict[str, Any] | None, seed: int
                         ) -> dict[str, str | None]:
    """Figures that do not need the threshold fit."""
    return {
        "wait_distributions": figs.wait_distributions(cycles),
        "manipulation": figs.manipulation(cycles, seed),
        "participants": figs.participants(cycles, PRIMARY_WAIT, "switched",
                                          (truth or {}).get("participant_threshold_s")),
    }


def _fit_figures(cycles: pd.DataFrame, truth: dict[str, Any] | None, res: Any,
                 threshold: dict[str, Any]) -> dict[str, str | None]:
    t = truth or {}
    true_psi = t.get("threshold_s") if t.get("has_threshold") else None
    pt = threshold.get("personal") or {}
    reported = (pt["median_psi_s"], *pt["ci_s"]) if threshold.get("found") else None
    return {"switch_vs_wait": figs.switch_vs_wait(cycles, PRIMARY_WAIT, "switched", res,
                                                  WAIT_MEASURES[PRIMARY_WAIT], true_psi,
                                                  reported)}


# --------------------------------------------------------------------------------- HTML


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"  # 8000, not 8e+03
        return f"{x:.{digits}g}"
    return str(x)


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f} %"


def _signed_pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):+.1f} %"


def _seconds(x: Any) -> str:
    """A duration with its unit, or a bare dash when there is none."""
    text = _fmt(x)
    return text if text == "—" else f"{text} s"


def _count(n: Any, noun: str) -> str:
    """``1 participant``, ``4 participants``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _capitalize_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def render_html(results: dict[str, Any], figures: dict[str, str | None]) -> str:
    """The self-contained report (jinja2 template ``analysis/templates/report.html.j2``)."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader(__package__, "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["fmt"] = _fmt
    env.filters["pct"] = _pct
    env.filters["spct"] = _signed_pct
    env.filters["sec"] = _seconds
    env.filters["count"] = _count
    env.filters["capitalize_first"] = _capitalize_first
    template = env.get_template("report.html.j2")
    clean = {k: v for k, v in results.items() if not k.startswith("_")}
    return template.render(r=clean, fig=figures,
                           results_json=json.dumps(jsonable(clean), indent=1))
