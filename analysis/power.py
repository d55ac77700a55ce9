"""Power analysis by simulation (docs/concepts/analysis.md#power): the report's own analysis, run
on many simulated studies of each size.

For every cell (participants × prompts per participant) and replicate, the virtual simulator
(``flowtrial.study.simulator.simulate_virtual_frames``, in memory, no database) generates a study
under a known truth; the metrics layer turns it into the cycle table, and the same
threshold analysis as ``flowtrial analyze`` (``fit_threshold`` on idle wait, participant-
cluster bootstrap CI, parametric-bootstrap existence test) is run — plus the METR-style
task-time effect when the design has arms. Per cell the grid reports:

* ``power_threshold`` — share of replicates that report a threshold (``found``); under a
  ``smooth`` or ``flat`` truth this is the false-positive rate;
* ``ci_coverage`` — share of successful fits whose 95 % CI contains ψ*, the pooled model's
  estimand for that replicate's waits (hinge truth only): the onset of the
  population-averaged switch curve (`flowtrial.analysis.threshold.pseudo_true_psi`). With
  heterogeneous ψᵢ (log-sd 0.35 by default) ψ* sits below the median personal ψ, so
  ``ci_coverage_median_psi`` (coverage of the median) falls as studies grow — both are shown;
* ``power_effect`` — share of replicates whose task-time effect is significant (CR2
  participant-clustered p < 0.05) *and* in the true direction (the fast arm saves time);
  ``effect_wrong_direction`` — significant in the wrong direction (parallel / crossover);
* ``prompts_simulated`` — the prompts per participant actually simulated (tasks × prompts
  per task, which can differ from the requested ``prompts``).

Replicates are independent seeded jobs (seed, cell, replicate), spread over worker processes;
results do not depend on the number of workers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .workers import run_jobs

ProgressFn = Callable[[int, int], None]  # (replicates done, total)

GRID_COLUMNS = [
    "participants", "prompts", "prompts_simulated", "sims", "truth", "threshold_s",
    "power_threshold",
    "power_threshold_ci_lo", "power_threshold_ci_hi", "ci_coverage",
    "ci_coverage_median_psi", "psi_star_s", "median_psi_s",
    "median_ci_decades", "fit_failures", "power_effect", "effect_wrong_direction",
    "mean_effect", "effect_failures",
    "seconds_per_sim",
]


def _seed(seed: int, n_part: int, n_prompts: int, rep: int) -> int:
    return int(np.random.SeedSequence([seed, n_part, n_prompts, rep]).generate_state(1)[0])


def design_tasks(config: Any, prompts: int) -> tuple[int, int]:
    """(tasks, prompts per task) for a simulated participant with ``prompts`` prompts.

    Per-prompt designs use one task; parallel designs four; crossover designs one task per
    period (at least the number of arms), so every arm gets tasks.
    """
    design = config.study.design
    if design == "per_prompt":
        tasks = 1
    elif design == "crossover":
        tasks = config.study.periods or len(config.arms)
    else:
        tasks = 4
    tasks = max(1, min(tasks, prompts))
    return tasks, max(1, round(prompts / tasks))


def run_replicate(config: Any, truth: str, threshold_s: float, n_part: int, n_prompts: int,
                  rep: int, seed: int, n_boot: int) -> dict[str, Any]:
    """One simulated study and its analysis; a flat dict of outcomes."""
    from flowtrial.study.simulator import SimParams, simulate_virtual_frames

    from .metrics import cycle_table_from_frames, frames_from_tables, task_table_from_frames
    from .report import task_effect_section
    from .report_sections import threshold_section

    t0 = time.perf_counter()
    s = _seed(seed, n_part, n_prompts, rep)
    params = SimParams(truth=truth, threshold_s=threshold_s)
    tasks, per_task = design_tasks(config, n_prompts)
    tables = simulate_virtual_frames(config, params, n_part, tasks=tasks,
                                     prompts_per_task=per_task, seed=s, design_seed=s)
    frames = frames_from_tables(tables, config)
    cycles = cycle_table_from_frames(frames)
    ok = cycles[cycles["status"] == "ok"]
    med = float(ok["tokens_completion"].median()) if len(ok) else None
    thr, _ = threshold_section(cycles, "idle_wait_s", "switched", n_boot=n_boot, seed=s)
    psi_star = None
    if truth == "hinge" and len(ok):
        from flowtrial.study.simulator.params import (
            detection_share,
            expected_switch_probability,
        )

        from .threshold_truth import pseudo_true_psi

        w = ok["idle_wait_s"].to_numpy(float)
        w = w[np.isfinite(w) & (w > 0)]
        # The curve of *counted* switches: the rule misses those shorter than its minimum.
        counted = detection_share(params, config.capture.switch_min_away_s)
        psi_star = pseudo_true_psi(w, counted * expected_switch_probability(w, params))
    row: dict[str, Any] = {
        "participants": n_part, "prompts": n_prompts, "rep": rep, "seed": s,
        # Tasks × prompts per task can differ from the request (10 over 4 tasks is 3 × 4 = 12).
        "prompts_simulated": tasks * per_task,
        "psi_star": psi_star,
        "fit_ok": thr.get("psi_s") is not None, "found": bool(thr.get("found")),
        "psi_s": thr.get("psi_s"), "p_exists": thr.get("p_exists"),
        "ci_lo": (thr.get("ci_s") or [None, None])[0],
        "ci_hi": (thr.get("ci_s") or [None, None])[1],
        "effect": None, "effect_p": None, "effect_ok": False,
    }
    if config.study.design != "per_prompt" and len(config.arms) >= 2:
        eff = task_effect_section(config, task_table_from_frames(frames), med or 300.0)
        if "estimate" in eff:
            row.update(effect=eff["estimate"], effect_p=(eff.get("p") or {}).get("cluster_cr2"),
                       effect_ok=True)
    row["seconds"] = time.perf_counter() - t0
    return row


def power_replicates(
    config: Any,
    participants: Sequence[int],
    prompts: Sequence[int],
    sims: int,
    truth: str = "hinge",
    threshold_s: float = 8.0,
    seed: int = 0,
    progress: ProgressFn | None = None,
    *,
    n_boot: int = 100,
    workers: int | None = None,
) -> pd.DataFrame:
    """Every replicate's outcomes (one row per cell × replicate)."""
    if sims < 1:
        raise ValueError("sims must be >= 1")
    if truth not in ("hinge", "smooth", "flat"):
        raise ValueError(f"unknown truth {truth!r}: use hinge, smooth or flat")
    jobs = [(config, truth, threshold_s, n, k, r, seed, n_boot)
            for n in participants for k in prompts for r in range(sims)]
    rows = run_jobs(run_replicate, jobs, workers, on_done=progress)
    return pd.DataFrame(rows).sort_values(["participants", "prompts", "rep"],
                                          ignore_index=True)


def summarize(reps: pd.DataFrame, truth: str, threshold_s: float) -> pd.DataFrame:
    """Per-cell power, coverage and effect power from ``power_replicates`` output."""
    from .report_sections import wilson

    out = []
    for (n, k), g in reps.groupby(["participants", "prompts"], sort=True):
        sims = len(g)
        fit = g[g["fit_ok"]]
        found = int(g["found"].sum())
        lo, hi = wilson(found, sims)
        cover = cover_median = None
        if truth == "hinge" and len(fit):
            # Scored against ψ*, the pooled model's estimand (onset of the averaged curve).
            star = fit["psi_star"].astype(float)
            cover = float(((fit["ci_lo"] <= star) & (star <= fit["ci_hi"])).mean())
            cover_median = float(
                ((fit["ci_lo"] <= threshold_s) & (threshold_s <= fit["ci_hi"])).mean())
        decades = np.log10(fit["ci_hi"].astype(float) / fit["ci_lo"].astype(float))
        eff = g[g["effect_ok"]]
        out.append({
            "participants": int(n), "prompts": int(k),
            "prompts_simulated": int(g["prompts_simulated"].iloc[0]), "sims": sims,
            "truth": truth,
            "threshold_s": threshold_s,
            "power_threshold": found / sims,
            "power_threshold_ci_lo": float(lo), "power_threshold_ci_hi": float(hi),
            "ci_coverage": cover,
            "ci_coverage_median_psi": cover_median,
            "psi_star_s": float(fit["psi_star"].astype(float).median()) if cover is not None
            else None,
            "median_psi_s": float(fit["psi_s"].median()) if len(fit) else None,
            "median_ci_decades": float(decades.median()) if len(fit) else None,
            "fit_failures": int(sims - len(fit)),
            # Success is a significant effect in the true direction (the fast arm saves time:
            # estimate < 0); a significant slowdown is an error, counted separately.
            "power_effect": float(((eff["effect_p"].astype(float) < 0.05)
                                   & (eff["effect"].astype(float) < 0)).mean())
            if len(eff) else None,
            "effect_wrong_direction": float(((eff["effect_p"].astype(float) < 0.05)
                                             & (eff["effect"].astype(float) > 0)).mean())
            if len(eff) else None,
            "mean_effect": float(eff["effect"].astype(float).mean()) if len(eff) else None,
            "effect_failures": int(sims - len(eff)) if len(eff) else None,
            "seconds_per_sim": float(g["seconds"].mean()),
        })
    return pd.DataFrame(out, columns=GRID_COLUMNS)


def power_grid(
    config: Any,
    participants: list[int],
    prompts: list[int],
    sims: int,
    truth: str = "hinge",
    threshold_s: float = 8,
    seed: int = 0,
    progress: ProgressFn | None = None,
    *,
    n_boot: int = 100,
    workers: int | None = None,
) -> pd.DataFrame:
    """Power to detect the threshold, CI coverage of the true ψ and power of the task-time
    effect for every (participants, prompts per participant) cell, from ``sims`` simulated
    studies each (columns: ``GRID_COLUMNS``). ``n_boot`` bootstrap and null replicates per
    fit (100 by default: power needs many fits; the report uses 200)."""
    bad = [v for v in [*participants, *prompts] if v < 1]
    if bad or not participants or not prompts:
        raise ValueError("participants and prompts must be lists of whole numbers >= 1")
    if not math.isfinite(threshold_s) or threshold_s <= 0:
        raise ValueError("threshold_s must be > 0 seconds")
    reps = power_replicates(config, participants, prompts, sims, truth, threshold_s, seed,
                            progress, n_boot=n_boot, workers=workers)
    return summarize(reps, truth, threshold_s)
