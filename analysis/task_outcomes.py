"""Task outcomes after review, a secondary analysis (METR's post-review outcome;
docs/researchers/field-study.md#4-tasks-with-links-and-outcomes).

A participant records, after the review of a task's pull request, how long they still
worked on it (``post_review_s``) and how it ended (``outcome``: done, abandoned or failed
review). The secondary analysis estimates the fast arm's effect on the **total** time (task
time + post-review time, tasks with both) with the same model as the primary task-time
effect, and tabulates outcomes per arm.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import AnalysisInputError
from .report_sections import order_arms

__all__ = ["OUTCOMES", "post_review_section"]

OUTCOMES = ("done", "abandoned", "failed_review")


def _outcomes(t: pd.DataFrame, arms: list[str]) -> list[dict[str, Any]]:
    rows = []
    for arm in arms:
        a = t[t["arm"] == arm]
        known = a["outcome"].dropna().astype(str)
        row: dict[str, Any] = {"arm": arm, "n_tasks": int(len(a)),
                               "n_reviewed": int(a["post_review_s"].notna().sum())}
        for o in OUTCOMES:
            row[o] = int((known == o).sum())
        total = a["task_time_s"] + a["post_review_s"]
        row["median_total_time_s"] = float(total.median()) if total.notna().any() else None
        rows.append(row)
    return rows


def post_review_section(config: Any, tasks: pd.DataFrame, median_tokens: float
                        ) -> dict[str, Any]:
    """Outcomes per arm and the effect on task + post-review time (a secondary row)."""
    from .effects import estimate_effect

    if tasks.empty or "outcome" not in tasks.columns:
        return {"skipped": "no tasks in this study"}
    t = tasks[tasks["arm"].notna()]
    arms = order_arms(config, sorted(t["arm"].astype(str).unique()), median_tokens)
    out: dict[str, Any] = {"by_arm": _outcomes(t, arms),
                           "n_reviewed": int(t["post_review_s"].notna().sum())}
    if config.study.design == "per_prompt":
        out["skipped"] = "per-prompt design: no task-time contrast between arms"
        return out
    ok = t[np.isfinite(t["task_time_s"].to_numpy(float))
           & np.isfinite(t["post_review_s"].to_numpy(float))]
    if len(arms) < 2 or ok["arm"].nunique() < 2:
        out["skipped"] = ("no post-review times recorded in two arms yet (participants "
                          "enter them on the task's page after review)")
        return out
    fast, slow = arms[0], arms[-1]
    ok = ok[ok["arm"].isin([fast, slow])].assign(
        treatment=lambda d: (d["arm"] == fast).astype(int))
    has_fc = ok["forecast_slow_s"].notna().any()
    try:
        res = estimate_effect(ok, time=["task_time_s", "post_review_s"], treatment="treatment",
                              forecast="forecast_slow_s" if has_fc else None,
                              cluster="participant_id", impute="drop")
    except AnalysisInputError as exc:
        out["skipped"] = str(exc)
        return out
    out["effect"] = {**res.to_dict(), "treatment_arm": fast, "control_arm": slow,
                     "time": "task_time_s + post_review_s"}
    return out
