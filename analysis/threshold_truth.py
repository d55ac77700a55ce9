"""ψ under a known truth (docs/concepts/analysis.md#flow-threshold): switch data simulated
from a hinge, smooth or flat truth, and ψ*, the value the pooled hinge of
:mod:`.threshold` converges to on such data (the onset of the population-averaged curve,
below the median person's threshold when thresholds differ between people). Used to score
the estimator (benchmarks, the report's ground-truth row, the power analysis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

from . import AnalysisInputError
from .pooled_fit import expit, newton

__all__ = ["NO_THRESHOLD_TRUTHS", "TRUTHS", "population_onset_psi", "pseudo_true_psi",
           "simulate_switch_data"]


def _sim_logit_eta(
    truth: str,
    logw: np.ndarray,
    log_psi_i: np.ndarray | float,
    p_low: float,
    p_high: float,
    p_flat: float,
    psi_s: float,
    wait_range_s: tuple[float, float],
) -> np.ndarray:
    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    w_min, w_max = wait_range_s
    if truth == "hinge":
        slope = (logit(p_high) - logit(p_low)) / math.log(w_max / psi_s)
        return logit(p_low) + slope * np.maximum(0.0, logw - log_psi_i)
    if truth == "smooth":
        slope = (logit(p_high) - logit(p_low)) / math.log(w_max / w_min)
        return logit(p_low) + slope * (logw - math.log(w_min)) + 0.0 * log_psi_i
    if truth == "seconds":  # the same rise, linear in the wait in seconds
        slope = (logit(p_high) - logit(p_low)) / (w_max - w_min)
        return logit(p_low) + slope * (np.exp(logw) - w_min) + 0.0 * log_psi_i
    return np.full(np.broadcast(logw, log_psi_i).shape, logit(p_flat))


Truth = Literal["hinge", "smooth", "flat", "logistic_slopes", "logistic_seconds", "hazard",
                "hinge_slopes", "bimodal", "sigmoid", "weibull_frailty", "sigmoid_midpoints",
                "gompertz"]
TRUTHS: tuple[str, ...] = ("hinge", "smooth", "flat", "logistic_slopes", "logistic_seconds",
                           "hazard", "hinge_slopes", "bimodal", "sigmoid", "weibull_frailty",
                           "sigmoid_midpoints", "gompertz")
#: Truths without a threshold: a test that reports one under them makes a false claim.
NO_THRESHOLD_TRUTHS = frozenset({"smooth", "flat", "logistic_slopes", "logistic_seconds",
                                 "hazard", "sigmoid", "weibull_frailty", "sigmoid_midpoints",
                                 "gompertz"})
#: The S-shaped truths: their rise in log wait, and its width (log-sd of the normal CDF).
S_SHAPED = ("sigmoid", "sigmoid_midpoints", "gompertz")
S_WIDTH = 1.2


def _prompt_counts(rng: np.random.Generator, n_participants: int, n_prompts: int,
                   unbalanced: bool) -> np.ndarray:
    """Prompts per participant: all ``n_prompts``, or (unbalanced) log-uniform between a
    quarter and twice that, with the same expected total on average."""
    if not unbalanced:
        return np.full(n_participants, n_prompts)  # no draw: balanced seeds keep their data
    raw = np.exp(rng.uniform(math.log(0.25), math.log(2.0), n_participants))
    return np.maximum(5, np.round(raw / raw.mean() * n_prompts)).astype(int)


def simulate_switch_data(
    truth: Truth,
    n_participants: int,
    n_prompts: int,
    psi_s: float = 8.0,
    psi_sd: float = 0.35,
    p_low: float = 0.03,
    p_high: float = 0.60,
    seed: int = 0,
    *,
    wait_range_s: tuple[float, float] = (0.2, 60.0),
    p_flat: float = 0.10,
    intercept_sd: float = 0.0,
    slope_sd: float = 0.0,
    rate_sd: float = 0.6,
    bimodal_ratio: float = 6.0,
    unbalanced: bool = False,
) -> pd.DataFrame:
    """Simulate cycles (`participant_id`, `wait_s`, `switched`, `true_psi_s`) with known truth.

    Waits are log-uniform on `wait_range_s` (per-prompt randomisation). Participant i has
    ψᵢ = ψ·exp(psi_sd·zᵢ), a random intercept uᵢ ~ N(0, intercept_sd) and a slope factor
    sᵢ = exp(slope_sd·wᵢ) (wᵢ ~ N(0, 1)) multiplying the rise.
    * hinge:  logit p = logit(p_low) + uᵢ + sᵢ·b·max(0, log w − log ψᵢ), with b such that a
      participant at ψᵢ = ψ reaches p_high at the longest wait;
    * hinge_slopes: the hinge with people's slopes above ψ differing (slope_sd, default 0.8
      when 0 is given);
    * bimodal: the hinge with half the people at ψ/√ratio and half at ψ·√ratio (no spread
      within a group);
    * smooth: logit p = logit(p_low) + uᵢ + sᵢ·b·(log w − log w_min), p_low at the shortest
      and p_high at the longest wait, no threshold;
    * logistic_slopes: smooth with people differing in intercept and slope (defaults 0.6 and
      0.5 when 0 is given);
    * logistic_seconds: the same rise linear in the wait in seconds, p_low at the shortest
      and p_high at the longest wait, people differing in intercept and slope (0.6 each
      when 0 is given): on a log-wait axis flat, then ever steeper; no threshold;
    * hazard: memoryless switching — a background chance p_low plus a constant hazard per
      second of waiting, P = 1 − (1 − p_low)·exp(−λᵢ·w), λᵢ = λ·exp(rate_sd·zᵢ) with λ
      such that the median person reaches p_high at the longest wait (uᵢ shifts the
      background on the logit scale); no threshold;
    * sigmoid: a smooth S-shaped rise with no breakpoint, logit p = logit(p_low) + uᵢ +
      sᵢ·R·Φ((log w − log ψ)/1.2), R = logit(p_high) − logit(p_low) (slope_sd 0.4 when 0);
    * sigmoid_midpoints: the sigmoid's rise with its midpoint differing between people, at
      log ψᵢ (as the hinge's thresholds do), instead of its size;
    * gompertz: an asymmetric rise, R·exp(−e^(−1.5·(log w − log ψᵢ)/1.2)), midpoints
      differing as in sigmoid_midpoints (both are skeptics' truths: the S-curve alternative
      was not built for them);
    * weibull_frailty: an increasing hazard with gamma frailty, P = 1 − (1 − p_low)·
      exp(−(Gᵢ·λ·w)^1.5), Gᵢ ~ Gamma(2, 1/2) (mean 1), λ such that the median person reaches
      p_high at the longest wait; no threshold (a family the estimator was not built for);
    * flat:   logit p = logit(p_flat) + uᵢ (the null; p_flat ≈ the default hinge's mean rate).
    ``unbalanced`` gives participants different numbers of prompts (`_prompt_counts`).
    """
    if truth not in TRUTHS:
        raise AnalysisInputError(f"unknown truth {truth!r}; use {', '.join(TRUTHS)}")
    if truth == "hinge_slopes" and slope_sd == 0:
        slope_sd = 0.8
    if truth == "logistic_slopes":
        intercept_sd = intercept_sd or 0.6
        slope_sd = slope_sd or 0.5
    if truth == "logistic_seconds":
        intercept_sd = intercept_sd or 0.6
        slope_sd = slope_sd or 0.6
    if truth == "sigmoid":
        slope_sd = slope_sd or 0.4
    rng = np.random.default_rng(seed)
    w_min, w_max = wait_range_s
    zs = rng.standard_normal(n_participants)
    if truth == "bimodal":
        half = np.arange(n_participants) % 2 == 0
        psi_i = psi_s * np.where(half, 1 / math.sqrt(bimodal_ratio), math.sqrt(bimodal_ratio))
    else:
        psi_i = psi_s * np.exp(psi_sd * zs)
    u_i = intercept_sd * rng.standard_normal(n_participants)
    counts = _prompt_counts(rng, n_participants, n_prompts, unbalanced)
    pid = np.repeat(np.arange(n_participants), counts)
    logw = rng.uniform(math.log(w_min), math.log(w_max), size=pid.size)
    # Drawn after the waits, and only when used, so the older truths keep their seeds' data.
    s_i = (np.exp(slope_sd * rng.standard_normal(n_participants)) if slope_sd > 0
           else np.ones(n_participants))
    if truth in (*S_SHAPED, "weibull_frailty"):
        p = _smooth_family_p(truth, logw, pid, u_i, s_i, np.log(psi_i), rng, p_low, p_high,
                             psi_s, w_max)
    elif truth == "hazard":
        lam = -math.log((1 - p_high) / (1 - p_low)) / w_max * np.exp(rate_sd * zs)
        base = expit(math.log(p_low / (1 - p_low)) + u_i)
        p = 1 - (1 - base[pid]) * np.exp(-lam[pid] * np.exp(logw))
    else:
        kind = {"hinge_slopes": "hinge", "bimodal": "hinge", "logistic_slopes": "smooth",
                "logistic_seconds": "seconds"}.get(truth, truth)
        lo = math.log(p_low / (1 - p_low))
        eta = _sim_logit_eta(kind, logw, np.log(psi_i)[pid], p_low, p_high, p_flat, psi_s,
                             wait_range_s)
        base_eta = lo if kind != "flat" else math.log(p_flat / (1 - p_flat))
        # The rise (eta minus its floor) scales with the person's slope factor.
        p = expit(base_eta + s_i[pid] * (eta - base_eta) + u_i[pid])
    switched = rng.random(pid.size) < p
    return pd.DataFrame(
        {
            "participant_id": pid,
            "wait_s": np.exp(logw),
            "switched": switched.astype(int),
            "true_psi_s": psi_i[pid],
        }
    )


def _smooth_family_p(truth: str, logw: np.ndarray, pid: np.ndarray, u_i: np.ndarray,
                     s_i: np.ndarray, log_psi_i: np.ndarray, rng: np.random.Generator,
                     p_low: float, p_high: float, psi_s: float, w_max: float) -> np.ndarray:
    """Switch probabilities of the S-shaped truths (`S_SHAPED`) and "weibull_frailty" (no
    threshold)."""
    from scipy.stats import norm

    lo = math.log(p_low / (1 - p_low))
    if truth in S_SHAPED:
        mid = math.log(psi_s) if truth == "sigmoid" else log_psi_i[pid]
        arg = (logw - mid) / S_WIDTH
        shape = np.exp(-np.exp(-1.5 * arg)) if truth == "gompertz" else norm.cdf(arg)
        rise = (math.log(p_high / (1 - p_high)) - lo) * shape
        return np.asarray(expit(lo + u_i[pid] + s_i[pid] * rise))
    g = rng.gamma(2.0, 0.5, size=u_i.size)
    lam = (-math.log((1 - p_high) / (1 - p_low))) ** (1 / 1.5) / w_max
    base = expit(lo + u_i)
    return np.asarray(1 - (1 - base[pid]) * np.exp(-(g[pid] * lam * np.exp(logw)) ** 1.5))


def population_onset_psi(
    psi_s: float = 8.0,
    psi_sd: float = 0.35,
    p_low: float = 0.03,
    p_high: float = 0.60,
    *,
    wait_range_s: tuple[float, float] = (0.2, 60.0),
    intercept_sd: float = 0.0,
    wait_quantiles: tuple[float, float] = (0.05, 0.95),
) -> float:
    """ψ* (seconds): the value `fit_threshold` converges to on data from
    `simulate_switch_data("hinge", ...)` as the study grows.

    With thresholds varying between people (psi_sd > 0) the pooled hinge fits the
    population-averaged curve P̄(w) = E_i[P_i(w)], whose onset lies below the median individual
    threshold ψ (the most sensitive people start switching first). Computed without sampling:
    P̄ by Gauss–Hermite quadrature over ψᵢ and uᵢ on a fine log-uniform wait grid, then the
    hinge fitted to P̄ by maximum expected log-likelihood with the estimator's own ψ grid range.
    """
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    weights = weights / weights.sum()
    lo, hi = math.log(wait_range_s[0]), math.log(wait_range_s[1])
    x = np.linspace(lo, hi, 1201)
    x = 0.5 * (x[1:] + x[:-1])  # midpoints: equal mass under the log-uniform design
    log_psi_i = math.log(psi_s) + psi_sd * nodes
    eta = _sim_logit_eta(
        "hinge", x[:, None], log_psi_i[None, :], p_low, p_high, 0.5, psi_s, wait_range_s
    )
    p_bar = np.zeros_like(x)
    for u, wu in zip(
        intercept_sd * nodes if intercept_sd > 0 else [0.0],
        weights if intercept_sd > 0 else [1.0],
        strict=True,
    ):
        p_bar += wu * (expit(eta + u) @ weights)
    c_lo, c_hi = lo + wait_quantiles[0] * (hi - lo), lo + wait_quantiles[1] * (hi - lo)
    return _expected_fit_psi(x, p_bar, c_lo, c_hi, math.log(p_low / (1 - p_low)))


def _expected_fit_psi(logw: np.ndarray, p: np.ndarray, c_lo: float, c_hi: float,
                      a0: float) -> float:
    """ψ (s) maximizing the hinge's expected log-likelihood for true probabilities ``p`` at
    log waits ``logw``, searched over [c_lo, c_hi] in log ψ: a coarse grid, then a fine one
    around its best point."""
    n = np.ones_like(logw)
    grid = np.linspace(c_lo, c_hi, 121)
    best = grid[0]
    for _ in range(2):
        H = np.maximum(0.0, logw[:, None] - grid[None, :])
        g = grid.size
        _, _, ll = newton(H, H * H, p @ H, n, p, np.full(g, a0), np.ones(g))
        best = grid[int(np.argmax(ll))]
        step = grid[1] - grid[0]
        grid = np.linspace(best - step, best + step, 81)
    return float(math.exp(best))


def pseudo_true_psi(
    waits_s: Sequence[float] | np.ndarray,
    p_expected: Sequence[float] | np.ndarray,
    *,
    wait_quantiles: tuple[float, float] = (0.05, 0.95),
) -> float:
    """ψ* for a given design: what `fit_threshold` estimates on these waits as data grow.

    The hinge is fitted by maximum *expected* log-likelihood to the true switch
    probabilities ``p_expected`` at the study's own waits (one value per cycle, already
    averaged over the population's individual thresholds), over the same ψ range the
    estimator searches. This is the estimand of the pooled model (the onset of the
    population-averaged curve), so CI coverage is scored against it.
    """
    logw = np.log(np.asarray(waits_s, dtype=float))
    p = np.clip(np.asarray(p_expected, dtype=float), 1e-9, 1 - 1e-9)
    if logw.shape != p.shape or logw.size < 2:
        raise AnalysisInputError("pseudo_true_psi needs one expected probability per wait")
    c_lo, c_hi = np.quantile(logw, wait_quantiles)
    return _expected_fit_psi(logw, p, float(c_lo), float(c_hi), math.log(p.mean() / (1 - p.mean())))
