"""Task-time effects of a study with more than two arms
(docs/concepts/analysis.md#task-time-effect).

One regression holds every arm: log task time on one indicator per arm (the reference arm,
the slowest, absorbed by the constant), log forecast and the design's covariates. Each arm's
row is its indicator's coefficient, estimated with the others in the model, so all rows share
one residual variance and no task is left out. The **trend over speed** replaces the
indicators by log2 of each arm's expected wait: exp(β) − 1 is the change in task time per
doubling of the wait, the one-number summary a dose-response design is built for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from . import AnalysisInputError
from .effects import EffectResult, estimate_effect

_OTHER = "__arm"  # the column that carries the other arms' labels as a categorical covariate


def _contrast(df: pd.DataFrame, arm: str, reference: str, forecast: str | None,
              covariates: Sequence[str]) -> EffectResult:
    """``arm`` against ``reference`` with every other arm as its own dummy."""
    # The level that get_dummies drops must be "this arm or the reference": it sorts first.
    others = df["arm"].where(~df["arm"].isin([arm, reference]), "")
    data = df.assign(treatment=(df["arm"] == arm).astype(int), **{_OTHER: others})
    extra = [_OTHER] if data[_OTHER].nunique() > 1 else []
    return estimate_effect(data, time="task_time_s", treatment="treatment", forecast=forecast,
                           cluster="participant_id", impute="drop", mixed=False,
                           covariates=[*extra, *covariates] or None)


def arm_effects(tasks: pd.DataFrame, arms: Sequence[str], waits_s: dict[str, float], *,
                forecast: str | None, covariates: Sequence[str] = ()) -> dict[str, Any]:
    """Every arm against the slowest (``arms`` run fastest → slowest) and the trend over
    log2 expected wait. Rows that fail carry ``skipped`` with the reason."""
    reference = arms[-1]
    df = tasks[tasks["arm"].isin(arms)].copy()
    rows: list[dict[str, Any]] = []
    for arm in arms[:-1]:
        try:
            res = _contrast(df, arm, reference, forecast, covariates)
        except AnalysisInputError as exc:
            rows.append({"arm": arm, "skipped": str(exc)})
            continue
        rows.append({"arm": arm, "expected_wait_s": waits_s.get(arm), "estimate":
                     res.estimate, "ci": res.ci["cluster_cr2"], "p": res.p["cluster_cr2"],
                     "cr2_df": res.cr2_df, "n": res.n})
    return {"reference_arm": reference, "rows": rows,
            "trend": speed_trend(df, waits_s, forecast=forecast, covariates=covariates)}


def speed_trend(df: pd.DataFrame, waits_s: dict[str, float], *, forecast: str | None,
                covariates: Sequence[str] = ()) -> dict[str, Any]:
    """exp(β) − 1 per doubling of the arm's expected wait (β on log2 wait), CR2 interval."""
    waits = df["arm"].map(waits_s)
    if waits.isna().any() or not np.all(waits.to_numpy(float) > 0):
        return {"skipped": "an arm has no positive expected wait"}
    data = df.assign(log2_wait=np.log2(waits.to_numpy(float)))
    try:
        res = estimate_effect(data, time="task_time_s", treatment="log2_wait",
                              forecast=forecast, cluster="participant_id", impute="drop",
                              mixed=False, covariates=list(covariates) or None,
                              continuous=True)
    except AnalysisInputError as exc:
        return {"skipped": str(exc)}
    return {"per_doubling": res.estimate, "ci": res.ci["cluster_cr2"],
            "p": res.p["cluster_cr2"], "cr2_df": res.cr2_df, "n": res.n,
            "interpretation": "relative change in task time per doubling of the arm's "
                              "expected wait (exp(β) − 1, β on log2 wait)"}
