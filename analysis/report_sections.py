"""Building blocks of the `flowtrial analyze` report: the threshold section, secondary
outcomes, arm ordering, ground truth, and JSON conversion.

Each section returns plain JSON-ready dicts; sections that cannot be computed say why in a
``reason`` (or ``skipped``) field instead of raising, so a small study still gets a report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.timeline import DEFAULT_READING_TPS

from .threshold_speed import exceedance_table
from .threshold_test import ONSET_FACTOR, ONSETS_FROM_CYCLES, onsets_tested
from .threshold_verdict import personal_verdict

WAIT_MEASURES = {
    "idle_wait_s": "idle wait (TTFT + delivery lag behind reading)",
    "total_wait_s": "total wait (t_last_sent − t_request)",
    "experienced_ttft_s": "experienced time to first token",
}
WAIT_BANDS_S = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, math.inf]


# ----------------------------------------------------------------------------- helpers


def jsonable(obj: Any) -> Any:
    """Recursively convert numpy/pandas values to JSON types (NaN and NA become None)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        f = float(obj)
        return f if math.isfinite(f) else None
    if obj is None or obj is pd.NA or obj is pd.NaT:
        return None
    if isinstance(obj, pd.Timestamp):
        return obj.isoformat()
    if isinstance(obj, str):
        return obj
    try:
        if pd.isna(obj):
            return None
    except (TypeError, ValueError):
        pass
    return str(obj)


def wilson(k: np.ndarray | float, n: np.ndarray | float, z: float = 1.959964
           ) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for k successes out of n (vectorized; NaN where n = 0)."""
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        den = 1 + z * z / n
        mid = (p + z * z / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


def analysable(cycles: pd.DataFrame, wait_col: str) -> pd.DataFrame:
    """Cycles usable for wait analyses: status ok and a finite positive wait."""
    w = cycles[wait_col].to_numpy(dtype=float)
    ok = (cycles["status"].astype(str) == "ok").to_numpy() & np.isfinite(w) & (w > 0)
    return cycles[ok]


#: Waits a person needs for a curve of their own: two bins of 20 (``binned_rate``); with
#: fewer, a "curve" is one dot.
MIN_WAITS_PER_CURVE = 40


def per_person_curves(cycles: pd.DataFrame, wait_col: str) -> dict[str, int]:
    """How many people have a curve of their own (:data:`MIN_WAITS_PER_CURVE` measured
    waits) and how many have too few waits for one."""
    counts = switch_analysable(cycles, wait_col)["participant_id"].value_counts()
    enough = int((counts >= MIN_WAITS_PER_CURVE).sum())
    return {"min_waits": MIN_WAITS_PER_CURVE, "drawn": enough,
            "too_few": int(len(counts)) - enough}


#: Why a measure shows "—" rather than 0: the data to measure it is absent.
NOT_MEASURED = {
    "switches": ("no focus capture: no focus events recorded (no ActivityWatch import, no "
                 "client focus events), so context switches were not measured"),
    "decisions": ("no decisions recorded: no Continue data, event-API or agent-telemetry "
                  "decisions and no persistence check"),
}


def focus_captured(cycles: pd.DataFrame) -> bool:
    """Was there a focus timeline to measure switches on — any cycle of the study with a
    ``switch_source`` other than ``none`` (docs/concepts/capture.md)? Judged on the whole
    study: a person or arm without a single switch is measured as zero switches, a study
    without any focus events is not measured at all."""
    if "switch_source" not in cycles.columns:
        return True
    src = cycles["switch_source"]
    return bool((src.notna() & (src.astype(str) != "none")).any())


def switch_analysable(cycles: pd.DataFrame, wait_col: str) -> pd.DataFrame:
    """:func:`analysable` cycles, none when switches were not measured (the threshold's
    data)."""
    df = analysable(cycles, wait_col)
    return df if focus_captured(cycles) else df.iloc[0:0]


def _not_measured_reason(cycles: pd.DataFrame, wait_col: str) -> str | None:
    """The reason no switch analysis is possible although there are waits, else None."""
    if len(analysable(cycles, wait_col)) and not focus_captured(cycles):
        return "not measured: " + NOT_MEASURED["switches"]
    return None


def binned_rate(df: pd.DataFrame, wait_col: str, flag_col: str, n_bins: int = 10
                ) -> pd.DataFrame:
    """P(flag) in log-spaced quantile bins of the wait, with Wilson 95 % CIs."""
    w = df[wait_col].to_numpy(float)
    y = df[flag_col].to_numpy(dtype=float)
    if len(w) == 0:
        return pd.DataFrame(columns=["wait_s", "n", "k", "p", "lo", "hi"])
    n_bins = max(1, min(n_bins, len(np.unique(w)), len(w) // 20 or 1))
    edges = np.unique(np.quantile(np.log(w), np.linspace(0, 1, n_bins + 1)))
    idx = np.clip(np.searchsorted(edges, np.log(w), side="right") - 1, 0, max(len(edges) - 2, 0))
    g = pd.DataFrame({"b": idx, "lw": np.log(w), "y": y}).groupby("b")
    out = pd.DataFrame({"wait_s": np.exp(g["lw"].mean()), "n": g["y"].size(), "k": g["y"].sum()})
    out["p"] = out["k"] / out["n"]
    out["lo"], out["hi"] = wilson(out["k"].to_numpy(), out["n"].to_numpy())
    return out.reset_index(drop=True)


# ------------------------------------------------------------------------------ arms


def expected_wait_s(arm: Any, n_tokens: float) -> float:
    """Expected generation wait of an arm for an answer of ``n_tokens`` (unshaped arms: 0)."""
    ttft = (arm.ttft_ms or 0.0) / 1000.0
    tps = arm.tokens_per_second
    pace = (n_tokens - 1) / tps if tps else 0.0
    return ttft + pace


def order_arms(config: Any, arms: Sequence[str], n_tokens: float) -> list[str]:
    """Arms from fastest to slowest by their expected wait at the median answer length."""
    by_name = {a.name: a for a in config.arms}
    known = [a for a in arms if a in by_name]
    return sorted(known, key=lambda a: expected_wait_s(by_name[a], n_tokens))


# ------------------------------------------------------------------------- threshold


def threshold_section(
    cycles: pd.DataFrame,
    wait_col: str,
    switch_col: str,
    *,
    n_boot: int,
    seed: int,
) -> tuple[dict[str, Any], Any]:
    """fit_threshold (the pooled onset ψ*) on (participant, wait, switched); returns (JSON
    dict, result or None)."""
    from . import AnalysisInputError
    from .threshold import fit_threshold

    df = switch_analysable(cycles, wait_col)
    base: dict[str, Any] = {
        "wait_measure": wait_col,
        "wait_measure_label": WAIT_MEASURES.get(wait_col, wait_col),
        "switch_measure": switch_col,
        "n_cycles": int(len(df)),
        "n_participants": int(df["participant_id"].nunique()),
    }
    empty = {"psi_s": None, "ci_s": None, "p_exists": None, "model_choice": None,
             "found": False}
    frame = pd.DataFrame({"participant_id": df["participant_id"].to_numpy(),
                          "wait_s": df[wait_col].to_numpy(float),
                          "switched": df[switch_col].to_numpy(dtype=bool).astype(int)})
    n = max(10, int(n_boot))
    unmeasured = _not_measured_reason(cycles, wait_col)
    try:
        if unmeasured:
            raise AnalysisInputError(unmeasured)
        res = fit_threshold(frame, n_boot=n, n_null=n, seed=seed)
    except AnalysisInputError as exc:
        return {**base, **empty, "reason": f"Threshold not estimated: {exc}"}, None
    d = res.to_dict()
    d.pop("profile_loglik", None)
    d.pop("grid_s", None)
    return {**base, **d}, res


def personal_section(
    cycles: pd.DataFrame,
    wait_col: str,
    switch_col: str,
    pooled: dict[str, Any],
    *,
    reading_tps: float = DEFAULT_READING_TPS,
    all_switch_col: str | None = None,
    workers: int | None = None,
    progress: Any = None,
    alpha: float = 0.05,
    max_ci_decades: float = 1.0,
) -> dict[str, Any]:
    """The headline: median personal threshold e^c (95 % profile CI) and spread τ (CI, test
    of τ = 0) from the random-breakpoint model, with the verdict. The share of switches the
    rule counts is estimated as switches counted / switches under ``all_switch_col`` (the
    most inclusive rule), or taken as 1 without it. ``pooled`` is the ψ* section (its
    existence test is the test of "switching depends on the wait")."""
    from . import AnalysisInputError
    from .personal_threshold import estimate_detection_share
    from .threshold_verdict import fit_personal_and_test

    df = switch_analysable(cycles, wait_col)
    detection = 1.0
    if all_switch_col and all_switch_col in df.columns:
        detection = estimate_detection_share(df[switch_col].astype(bool),
                                             df[all_switch_col].astype(bool))
    frame = pd.DataFrame({"participant_id": df["participant_id"].to_numpy(),
                          "wait_s": df[wait_col].to_numpy(float),
                          "switched": df[switch_col].to_numpy(dtype=bool).astype(int)})
    base: dict[str, Any] = {"detection_share": detection,
                            "detection_share_source": all_switch_col or "assumed 1"}
    unmeasured = _not_measured_reason(cycles, wait_col)
    try:
        if unmeasured:
            raise AnalysisInputError(unmeasured)
        res, test = fit_personal_and_test(frame, detection_share=detection, workers=workers,
                                          progress=progress, alpha=alpha)
    except AnalysisInputError as exc:
        return {**base, "median_psi_s": None, "ci_s": None, "found": False,
                "reason": f"Threshold not estimated (personal model): {exc}"}
    # Percentiles assume log-normal thresholds: withheld when the shape check says otherwise.
    out = {**base, **res.to_dict(),
           "psi_p10_p90_s": res.psi_quantiles_s() if res.shape["lognormal_like"] else None,
           "alternatives": test.to_dict()}
    found, reason = personal_verdict(out, pooled, frame["wait_s"].to_numpy(float),
                                     test=out["alternatives"], alpha=alpha,
                                     max_ci_decades=max_ci_decades)
    out["found"], out["reason"] = found, reason
    tokens = df["tokens_completion"] if "tokens_completion" in df.columns else []
    unit = (cycles.attrs.get("wait_unit") or {}).get("unit", "cycle")
    out["speed_table"] = exceedance_table(res.median_psi_s, res.ci_s, tokens, found=found,
                                          reading_tps=reading_tps, wait_unit=unit)
    return out


def threshold_headline(threshold: dict[str, Any], wait_label: str) -> str:
    """The threshold verdict in one plain sentence: the report's banner opens with it and the
    demo's console prints it, so both state the same estimand, numbers, CI and units."""
    pt = threshold.get("personal") or {}
    wait_label = wait_label.split(" (")[0]  # "idle wait", without its definition
    if threshold.get("found") and pt.get("median_psi_s") is not None and pt.get("ci_s"):
        lo, hi = pt["ci_s"]
        return (f"Flow threshold found: the median person's threshold is "
                f"{_sig(pt['median_psi_s'])} s of {wait_label} "
                f"(95 % CI {_sig(lo)}–{_sig(hi)} s). " + onset_caveat(threshold))
    reason = (threshold.get("reason") or threshold.get("pooled_reason")
              or "the threshold was not estimated")
    for prefix in ("No threshold: ", "Threshold not estimated (personal model): ",
                   "Threshold not estimated: "):
        reason = reason.removeprefix(prefix)
    return f"No flow threshold reported: {reason.rstrip('.')}."


def onset_caveat(threshold: dict[str, Any]) -> str:
    """What a found threshold's test ruled out: with the gradual onsets among the
    alternatives (by default from `ONSETS_FROM_CYCLES` cycles), a gradual onset too;
    without them, only a steady rise (in log wait or in seconds)."""
    test = threshold.get("alternatives") or (threshold.get("personal") or {}).get(
        "alternatives") or {}
    if onsets_tested(test):
        return (f"Sharper than an onset rounded over a factor {ONSET_FACTOR:g} of the wait, an "
                "S-curve bending as gradually or a rise ever steeper in seconds (tested).")
    return (f"Switching is flat below it and rises above it; the test does not tell a sharp "
            f"threshold from a gradual onset (rounded over up to a factor {ONSET_FACTOR:g} of "
            f"the wait, or a rise ever steeper in seconds); it tests that from "
            f"{ONSETS_FROM_CYCLES:,} cycles on.")


def _sig(x: float) -> str:
    """Three significant digits, as the report's numbers."""
    return f"{float(x):.3g}"


# ------------------------------------------------------------------------ secondary


#: Closed cycle time a participant needs before their cycles per hour are reported.
MIN_OBSERVED_S_PER_RATE = 600.0


def _rates(g: pd.DataFrame, switch_col: str, persist_cols: list[str], captured: bool = True
           ) -> dict[str, Any]:
    """Secondary outcomes of the cycles ``g``; switch measures are None (shown "—") when the
    study has no focus capture (``captured``), never 0."""
    decided = g["decision"] != "none"
    n_dec = int(decided.sum())
    measured = np.full(len(g), captured)
    sw = g[switch_col].to_numpy(dtype=bool) & measured
    ct = g["cycle_time_s"].to_numpy(float)
    per_part = g.assign(ct=ct).groupby("participant_id")["ct"].agg(["mean", "sum"]).dropna()
    # An hourly rate from a few seconds of work says nothing (4 scripted cycles gave
    # "4,031 cycles / hour"): only participants with enough observed cycle time count.
    per_part = per_part[(per_part["mean"] > 0) & (per_part["sum"] >= MIN_OBSERVED_S_PER_RATE)]
    cph = 3600.0 / per_part["mean"]
    row: dict[str, Any] = {
        "n_cycles": int(len(g)),
        "n_participants": int(g["participant_id"].nunique()),
        "switches_measured": captured,
        "switch_rate": float(sw[measured].mean()) if measured.any() else None,
        "resumption_lag_s_mean": (float(g["resumption_lag_s"][measured].mean())
                                  if measured.any() else None),
        "resumption_lag_s_median_switched": (
            float(np.median(g["resumption_lag_s"].to_numpy(float)[sw])) if sw.any() else None),
        "cycles_per_hour": float(cph.mean()) if len(cph) else None,
        "decision_rate": float(decided.mean()) if len(g) else None,
        "acceptance_rate": float((g["decision"] == "accept").sum() / n_dec) if n_dec else None,
        "partial_rate": float((g["decision"] == "partial").sum() / n_dec) if n_dec else None,
        "review_time_s_median": (float(g["review_time_s"].median())
                                 if g["review_time_s"].notna().any() else None),
        "idle_wait_s_median": float(g["idle_wait_s"].median()) if len(g) else None,
        "total_wait_s_median": float(g["total_wait_s"].median()) if len(g) else None,
    }
    for c in persist_cols:
        v = g[c].dropna()
        row[f"{c}_rate"] = float(v.astype(bool).mean()) if len(v) else None
    return row


def secondary_outcomes(cycles: pd.DataFrame, wait_col: str, switch_col: str) -> dict[str, Any]:
    """Resumption lag, cycles per hour, acceptance and persistence rates, review time: by arm
    and by band of the wait measure."""
    ok = cycles[(cycles["status"].astype(str) == "ok").to_numpy()]
    persist_cols = [c for c in ok.columns if c.startswith("persisted_")]
    captured = focus_captured(cycles)
    by_arm = [{"arm": arm, **_rates(g, switch_col, persist_cols, captured)}
              for arm, g in ok.groupby("arm", sort=True)]
    w = ok[wait_col].to_numpy(float)
    band = np.searchsorted(WAIT_BANDS_S, np.nan_to_num(w, nan=-1), side="right") - 1
    by_band = []
    for b in range(len(WAIT_BANDS_S) - 1):
        g = ok[(band == b) & np.isfinite(w)]
        if len(g) == 0:
            continue
        lo, hi = WAIT_BANDS_S[b], WAIT_BANDS_S[b + 1]
        label = f"{lo:g}–{hi:g} s" if math.isfinite(hi) else f"≥ {lo:g} s"
        row = {"band": label, "lo_s": lo, "hi_s": hi if math.isfinite(hi) else None,
               **_rates(g, switch_col, persist_cols, captured)}
        k = int(g[switch_col].to_numpy(dtype=bool).sum())
        ci = wilson(k, len(g)) if captured else (None, None)
        row["switch_rate_ci"] = [None if v is None else float(v) for v in ci]
        by_band.append(row)
    not_measured = {}
    if len(ok) and not captured:
        not_measured["switch rate, resumption lag"] = NOT_MEASURED["switches"]
    if len(ok) and not (ok["decision"] != "none").any():
        not_measured["acceptance, partial, review time"] = NOT_MEASURED["decisions"]
    return {"wait_measure": wait_col, "switch_measure": switch_col, "by_arm": by_arm,
            "by_wait_band": by_band, "persistence_intervals": persist_cols,
            "overall": _rates(ok, switch_col, persist_cols, captured) if len(ok) else None,
            "not_measured": not_measured}


# ---------------------------------------------------------------------- ground truth


def ground_truth(database: Any) -> dict[str, Any] | None:
    """The simulator's population truth and per-participant ψ, if the database has them."""
    from sqlalchemy import inspect

    if not inspect(database.engine).has_table("ground_truth"):
        return None
    with database.engine.connect() as conn:
        rows = pd.read_sql("SELECT scope, participant_id, truth_model, params_json "
                           "FROM ground_truth", conn)
    return ground_truth_from_rows(rows)


def ground_truth_from_rows(rows: pd.DataFrame) -> dict[str, Any] | None:
    """Parse ground-truth rows (the table's columns) into a dict."""
    if rows is None or rows.empty:
        return None
    pop = rows[rows["scope"] == "population"]
    if pop.empty:
        return None
    params = json.loads(pop["params_json"].iloc[-1])
    per = {}
    for pid, raw in zip(rows.loc[rows["scope"] == "participant", "participant_id"],
                        rows.loc[rows["scope"] == "participant", "params_json"], strict=True):
        try:
            d = json.loads(raw)
        except (TypeError, json.JSONDecodeError):
            continue
        psi = d.get("threshold_s", d.get("psi_s"))
        if psi is not None:
            per[str(pid)] = float(psi)
    truth_model = str(pop["truth_model"].iloc[-1])
    return {
        "truth_model": truth_model,
        "params": params,
        "has_threshold": bool(params.get("has_threshold", truth_model == "hinge")),
        "threshold_s": params.get("threshold_s"),
        "threshold_logsd": params.get("threshold_logsd"),
        "seed": params.get("seed"),
        "share_of_switches_counted": params.get("share_of_switches_counted"),
        "participant_threshold_s": per,
    }


def truth_params(truth: dict[str, Any]) -> Any:
    """The simulator parameters stored with the ground truth, as a SimParams."""
    from flowtrial.study.simulator import SimParams

    known = set(SimParams.model_fields)
    stored = {k: v for k, v in (truth.get("params") or {}).items() if k in known}
    stored["truth"] = truth["truth_model"]
    return SimParams.model_validate(stored)


def estimand_psi(truth: dict[str, Any], waits_s: Any) -> float | None:
    """ψ*: the pooled hinge's estimand for this study's waits and the simulator's truth.

    With thresholds varying between people the pooled model estimates where the
    population-averaged curve starts rising, which lies below the median person's ψ. The
    curve is that of *counted* switches: the true probability times the share of switches
    long enough for the switch rule (without it ψ* comes out ~3.5 % too high).
    """
    from flowtrial.study.simulator.params import expected_switch_probability

    from .threshold_truth import pseudo_true_psi

    w = np.asarray(waits_s, dtype=float)
    w = w[np.isfinite(w) & (w > 0)]
    if not truth.get("has_threshold") or w.size < 2:
        return None
    params = truth_params(truth)
    counted = truth.get("share_of_switches_counted") or 1.0
    return pseudo_true_psi(w, counted * expected_switch_probability(w, params))


def compare_truth(
    truth: dict[str, Any], threshold: dict[str, Any], waits_s: Any = None
) -> dict[str, Any]:
    """True values against the estimates: the median personal threshold and τ (headline)
    and, secondary, the pooled ψ̂ against its estimand ψ*; and whether the verdict is right.
    """
    psi_median = truth.get("threshold_s")
    tau_true = truth.get("threshold_logsd")
    personal = threshold.get("personal") or {}
    est, ci = personal.get("median_psi_s"), personal.get("ci_s")
    tau, tau_ci = personal.get("tau"), personal.get("tau_ci")
    psi_star = estimand_psi(truth, waits_s) if waits_s is not None else None
    pooled, pooled_ci = threshold.get("psi_s"), threshold.get("ci_s")
    out: dict[str, Any] = {"truth_model": truth["truth_model"], "true_psi_s": psi_median,
                           "estimated_psi_s": est, "ci_s": ci, "true_tau": tau_true,
                           "estimated_tau": tau, "tau_ci": tau_ci,
                           "estimand_psi_s": psi_star, "pooled_psi_s": pooled,
                           "pooled_ci_s": pooled_ci, "found": bool(threshold.get("found"))}
    if truth["has_threshold"] and psi_median and est:
        out["log_ratio"] = math.log(est / psi_median)
        # None, not False, when the CI was not computed (no threshold found to bound).
        out["ci_covers_truth"] = bool(ci[0] <= psi_median <= ci[1]) if ci else None
        if tau_true is not None and tau_ci:
            out["tau_ci_covers_truth"] = bool(tau_ci[0] <= tau_true <= tau_ci[1])
    if truth["has_threshold"] and psi_star and pooled_ci:
        out["pooled_ci_covers_estimand"] = bool(pooled_ci[0] <= psi_star <= pooled_ci[1])
    out["verdict_correct"] = out["found"] == bool(truth["has_threshold"])
    return out
