"""Speed versus capability: the contrasts a matched-latency design identifies, with their
outcomes and manipulation checks (docs/researchers/speed-vs-capability.md).

The design (:mod:`flowtrial.study.factorial`) has a fast model at its natural speed, the
same model slowed to a slow model's measured latency (``matched_to``), and the slow model at
its natural speed. One regression holds every arm (log task time on arm indicators and log
forecast, period effects in crossovers; the matched arm is the reference), so

* **speed** = the fast model's natural arm against the matched arm (same model),
* **capability** = the slow model's arm against the matched arm (same latency),
* **naive** = the fast model against the slow one at their natural speeds (both at once),

each as exp(β) − 1 with its CR2 participant-clustered interval (Satterthwaite t).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.factorial import CONTRAST_MEANING, contrasts

from . import AnalysisInputError
from .arm_effects import contrast

#: A matched arm's delivered median TTFT / tokens/s may differ from its matched arm's by
#: this factor before the check warns (the proxy can only slow delivery, and draws from a
#: finite sample of recorded cycles).
MATCH_TOLERANCE = 1.25


def speed_capability_section(config: Any, tasks: pd.DataFrame, cycles: pd.DataFrame,
                             served: pd.DataFrame | None = None,
                             truth: dict[str, Any] | None = None) -> dict[str, Any]:
    """The section of the report: contrasts, outcomes per arm, the matched-latency check.

    ``served``: the raw cycles' (arm, model) pairs, for the served-model check; ``truth``:
    a simulated study's true contrasts (each row then says whether its CI covers it)."""
    pairs = contrasts(config)
    if not pairs:
        return {"skipped": "no arm is matched to another arm's latency: not a "
                           "speed-vs-capability design"}
    models = {a.name: a.model for a in config.arms}
    out: dict[str, Any] = {
        "arms": [{"arm": a.name, "model": a.model, "latency": a.latency,
                  "matched_to": a.matched_to} for a in config.arms],
        "contrasts": _with_truth(contrast_estimates(config, tasks), truth),
        "outcomes": _with_calls(outcomes_by_arm(tasks, cycles), served),
        "matched_latency": matched_latency_check(config, cycles),
        "served_models": _served(served, models),
    }
    return out


def contrast_estimates(config: Any, tasks: pd.DataFrame) -> list[dict[str, Any]]:
    """Each contrast of the design as exp(β) − 1 with its CR2 interval (rows that cannot be
    estimated carry ``skipped``)."""
    pairs = contrasts(config)
    t = tasks[np.isfinite(tasks["task_time_s"].to_numpy(float))
              & (tasks["task_time_s"].to_numpy(float) > 0) & tasks["arm"].notna()]
    t = t.assign(arm=t["arm"].astype(str))
    forecast = "forecast_slow_s" if t["forecast_slow_s"].notna().any() else None
    period = (config.study.design == "crossover" and "period" in t.columns
              and t["period"].nunique() > 1)
    rows = []
    for name, (arm, ref) in pairs.items():
        kind = name.split(":")[0]
        row: dict[str, Any] = {"contrast": name, "arm": arm, "reference": ref,
                               "meaning": CONTRAST_MEANING[kind]}
        try:
            res = contrast(t, arm, ref, forecast, ["period"] if period else [])
        except AnalysisInputError as exc:
            row["skipped"] = str(exc)
        else:
            row.update(estimate=res.estimate, ci=res.ci["cluster_cr2"],
                       p=res.p["cluster_cr2"], cr2_df=res.cr2_df, n=res.n,
                       n_clusters=res.n_clusters)
        rows.append(row)
    return rows


def _with_truth(rows: list[dict[str, Any]], truth: dict[str, Any] | None
                ) -> list[dict[str, Any]]:
    true = (truth or {}).get("contrasts") or {}
    for row in rows:
        value = true.get(row["contrast"])
        if value is None:
            continue
        row["true_effect"] = value
        if row.get("ci"):
            row["covers_truth"] = bool(row["ci"][0] <= value <= row["ci"][1])
    return rows


def outcomes_by_arm(tasks: pd.DataFrame, cycles: pd.DataFrame) -> list[dict[str, Any]]:
    """Per arm: task time, completion, attempts (prompts) per task, acceptance, switches
    during waits, tokens and the delivered speed. "—" (None) where nothing was measured."""
    rows = []
    for arm in sorted(set(tasks["arm"].dropna().astype(str)) | set(
            cycles["arm"].dropna().astype(str))):
        t = tasks[tasks["arm"].astype(str) == arm]
        c = cycles[cycles["arm"].astype(str) == arm]
        time_s = t["task_time_s"].to_numpy(float)
        status = t["status"].astype(str) if "status" in t.columns else pd.Series([], dtype=str)
        ended = status[status.isin(["done", "abandoned"])]
        decided = (c["decision"] if "decision" in c.columns else pd.Series([], dtype=str)
                   ).astype(str)
        decided = decided[decided.isin(["accept", "reject", "partial_accept"])]
        per_task = c.groupby("task_id").size() if "task_id" in c.columns else pd.Series([])
        rows.append({
            "arm": arm,
            "tasks": int(len(t)),
            "median_task_time_s": _median(time_s),
            "completed_share": float((ended == "done").mean()) if len(ended) else None,
            "attempts_per_task": float(per_task.mean()) if len(per_task) else None,
            "acceptance_rate": (float((decided == "accept").mean()) if len(decided)
                                else None),
            "switch_rate": (float(c["switched"].astype(float).mean())
                            if "switched" in c.columns and c["switched"].notna().any()
                            else None),
            "tokens_per_task": (float(c.groupby("task_id")["tokens_completion"].sum().mean())
                                if len(per_task) and "tokens_completion" in c.columns
                                else None),
            "median_ttft_s": _median(_values(c, "experienced_ttft_s")),
            "median_tps": _median(_values(c, "achieved_tps")),
        })
    return rows


def _with_calls(rows: list[dict[str, Any]], calls: pd.DataFrame | None
                ) -> list[dict[str, Any]]:
    """Model calls and tool steps per turn, per arm, from the raw cycles (each cycle is one
    model call; ``turn_id`` groups an agent's calls into the person's turn)."""
    for row in rows:
        row["calls_per_turn"] = row["tool_steps_per_turn"] = None
        if calls is None or "turn_id" not in calls.columns or calls["turn_id"].isna().all():
            continue
        mine = calls[calls["arm"].astype(str) == row["arm"]].dropna(subset=["turn_id"])
        turns = mine["turn_id"].nunique()
        if turns:
            row["calls_per_turn"] = len(mine) / turns
            row["tool_steps_per_turn"] = float(pd.to_numeric(
                mine["tool_calls"], errors="coerce").fillna(0).sum()) / turns
    return rows


def matched_latency_check(config: Any, cycles: pd.DataFrame) -> list[dict[str, Any]]:
    """Per matched arm: its delivered median TTFT and tokens/s against its matched arm's, and
    a two-sample Kolmogorov–Smirnov test of the TTFT distributions."""
    from scipy.stats import ks_2samp

    rows = []
    for a in config.arms:
        if a.matched_to is None:
            continue
        mine = cycles[cycles["arm"].astype(str) == a.name]
        theirs = cycles[cycles["arm"].astype(str) == a.matched_to]
        row: dict[str, Any] = {"arm": a.name, "matched_to": a.matched_to,
                               "cycles": int(len(mine)), "matched_cycles": int(len(theirs))}
        for col, key in (("experienced_ttft_s", "ttft"), ("achieved_tps", "tps")):
            x, y = _median(_values(mine, col)), _median(_values(theirs, col))
            row[f"median_{key}"], row[f"matched_median_{key}"] = x, y
            row[f"{key}_ratio"] = (x / y) if x is not None and y else None
        xs = _values(mine, "experienced_ttft_s")
        ys = _values(theirs, "experienced_ttft_s")
        xs, ys = xs[np.isfinite(xs)], ys[np.isfinite(ys)]
        row["ks_p_ttft"] = float(ks_2samp(xs, ys).pvalue) if len(xs) and len(ys) else None
        ratios = [r for r in (row["ttft_ratio"], row["tps_ratio"]) if r is not None]
        row["ok"] = (all(1 / MATCH_TOLERANCE <= r <= MATCH_TOLERANCE for r in ratios)
                     if ratios else None)
        rows.append(row)
    return rows


def _served(served: pd.DataFrame | None, models: dict[str, str | None]
            ) -> list[dict[str, Any]]:
    if served is None or served.empty:
        return []
    rows = []
    for arm, group in served.groupby(served["arm"].astype(str)):
        counts = group["model"].astype(str).value_counts()
        want = models.get(str(arm))
        rows.append({"arm": arm, "configured": want,
                     "served": {str(k): int(v) for k, v in counts.items()},
                     "ok": None if want is None else bool(set(counts.index) == {want})})
    return rows


def _values(df: pd.DataFrame, col: str) -> np.ndarray:
    """A column as floats (empty when the table does not have it: unmeasured, not zero)."""
    return df[col].to_numpy(float) if col in df.columns else np.array([], dtype=float)


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None
