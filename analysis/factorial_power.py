"""Power and recovery of a speed-vs-capability study, on simulated replicates
(docs/researchers/speed-vs-capability.md#ground-truth-and-power).

Each replicate simulates the study (virtual, with models of known speed and capability:
:mod:`flowtrial.study.simulator.capability`), replays the same people and tasks under every
arm for the true contrasts of that sample, and estimates every contrast as the report does.
Aggregated per contrast: power (share with p < 0.05), the mean estimate and truth, bias, and
how often the 95 % CI covers the truth, each with a Wilson 95 % interval.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .report_sections import wilson


def factorial_replicate(config: Any, params: Any, participants: int, tasks: int,
                        prompts_per_task: int, seed: int) -> list[dict[str, Any]]:
    """One simulated study: a row per contrast (estimate, CI, p, the sample's truth)."""
    from flowtrial.study.simulator.capability import factorial_truth
    from flowtrial.study.simulator.virtual import simulate_virtual_frames

    from .metrics import frames_from_tables, task_table_from_frames
    from .speed_capability import contrast_estimates

    t0 = time.perf_counter()
    tables = simulate_virtual_frames(config, params, participants, tasks, prompts_per_task,
                                     seed, design_seed=seed)
    truth = factorial_truth(config, params, participants, tasks, prompts_per_task, seed,
                            design_seed=seed)["contrasts"]
    est = contrast_estimates(config, task_table_from_frames(frames_from_tables(tables, config)))
    seconds = time.perf_counter() - t0
    rows = []
    for r in est:
        ci = r.get("ci") or [np.nan, np.nan]
        rows.append({"contrast": r["contrast"], "participants": participants, "seed": seed,
                     "estimate": r.get("estimate", np.nan), "ci_lo": ci[0], "ci_hi": ci[1],
                     "p": r.get("p", np.nan), "truth": truth.get(r["contrast"], np.nan),
                     "seconds": seconds})
    return rows


def _wilson(k: int, n: int) -> tuple[float, float]:
    lo, hi = wilson(k, n)
    return float(lo), float(hi)


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (contrast, participants): power, coverage (Wilson CIs), bias, mean truth."""
    out = []
    for (name, n), g in rows.groupby(["contrast", "participants"], sort=False):
        ok = g.dropna(subset=["estimate"])
        sig = int((ok["p"] < 0.05).sum())
        cov = int(((ok["ci_lo"] <= ok["truth"]) & (ok["truth"] <= ok["ci_hi"])).sum())
        out.append({
            "contrast": name, "participants": n, "replicates": len(ok),
            "mean_truth": float(ok["truth"].mean()), "mean_estimate": float(ok["estimate"].mean()),
            "bias": float((ok["estimate"] - ok["truth"]).mean()),
            "power": sig / max(len(ok), 1), "power_ci": _wilson(sig, len(ok)),
            "coverage": cov / max(len(ok), 1), "coverage_ci": _wilson(cov, len(ok)),
            "seconds_per_study": float(g["seconds"].mean()),
        })
    return pd.DataFrame(out)


def factorial_power(config: Any, params: Any, participants: Sequence[int], tasks: int,
                    prompts_per_task: int, replicates: int, seed: int = 0) -> pd.DataFrame:
    """Replicate studies at each size; :func:`summarise` of their rows."""
    rows = [r for n in participants for rep in range(replicates)
            for r in factorial_replicate(config, params, n, tasks, prompts_per_task,
                                         seed=seed * 100_003 + n * 1_009 + rep)]
    return summarise(pd.DataFrame(rows))
