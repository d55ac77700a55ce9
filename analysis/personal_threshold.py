"""The personal flow threshold (issue 16): median personal threshold e^c with a 95 % profile
CI, the between-person spread τ with its CI and a boundary LR test of τ = 0, and the model
comparison (random-breakpoint hinge vs random-intercept smooth and flat logistic, AIC/BIC).

The model and its numerics live in `analysis.rb_model`. After the main fit, the independent
refits (four profile endpoints, the τ = 0 fit, the comparison models and the quadrature
check) run on worker processes (`analysis.workers.run_jobs`, single-threaded BLAS), so a
fit uses every core; ``progress(done, total)`` reports them. The profile endpoints, the
slowest, can be left for later (``intervals=False``, then `add_intervals`): the threshold
analysis computes them only for a threshold its test supports (`threshold_verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import chi2

from . import AnalysisInputError
from .adaptive_fit import maximize_adaptive, start_adaptation
from .hinge_kernel import PersonNodes
from .rb_model import (
    PARAMS,
    CycleData,
    Fit,
    RandomBreakpointModel,
    maximize,
    profile_endpoint,
    wald_se,
)
from .workers import Background, run_jobs

ProgressFn = Callable[[int, int], None]
DEFAULT_NODES = (24, 7)
CHECK_NODES = (48, 11)  # the quadrature check: twice the breakpoint nodes
#: Nodes (z, v, s) of the hinge with a random slope above the breakpoint, and of its check.
SLOPE_NODES = (16, 5, 5)
SLOPE_CHECK_NODES = (24, 7, 7)
#: Under adaptive quadrature (`adaptive_fit`) each person's nodes follow their posterior, so
#: fewer do: the main fit, the random-slope fit and their quadrature checks.
ADAPTIVE_NODES = (12, 5)
ADAPTIVE_SLOPE_NODES = (12, 5, 5)
ADAPTIVE_CHECK_NODES = (20, 7)
ADAPTIVE_SLOPE_CHECK_NODES = (16, 7, 7)
#: "plain": one Gauss–Hermite grid for everyone; "adaptive": each person's nodes centred on
#: their posterior (docs/concepts/analysis.md, "Quadrature where people have many cycles").
QUADRATURES = ("plain", "adaptive")
#: The random slope is kept when the boundary LR test of κ = 0 gives p below this: whenever
#: κ̂ is clearly off 0 (LR > 0.016), not only when the test rejects at 5 %. Choosing the
#: smaller model by a 5 % test undercovered: where people's slopes differ mildly and the test
#: missed it, the two-effect hinge put the median threshold high (a reviewer's family, ψ 15 s,
#: slope log-sd 0.5, 30 × 80: the CI covered in 25/30, 4 of the 5 misses in the 8 studies
#: without the random slope; docs/concepts/analysis.md#measured-error-rates).
SLOPE_ALPHA = 0.45
#: The random-slope fit starts from these κ (the better optimum is kept).
KAPPA_STARTS = (0.3, 0.8)
#: The shape check: thresholds are called log-normal-like unless two equal groups of people
#: (thresholds e^(c ± τ), same number of parameters) fit better by more than this much
#: log-likelihood; otherwise percentiles of the threshold distribution are not printed.
#: Chosen from the family benchmark at 30 × 80 (docs/concepts/analysis.md#measured-error-rates):
#: under log-normal thresholds the gain reached 3.5 (2.0 flagged 2 of 8 studies), under
#: bimodal thresholds (ψ/√6 and ψ·√6) it was 6.6 and 15.
SHAPE_MARGIN = 4.0
_K = {"hinge": 5, "hinge_tau0": 4, "smooth": 3, "flat": 2}


@dataclass
class PersonalThresholdResult:
    """Outcome of `fit_personal_threshold` (JSON-ready via `to_dict`)."""

    median_psi_s: float
    ci_s: list[float] | None  # None: not computed (`add_intervals`)
    tau: float
    tau_ci: list[float] | None
    tau_lr: float
    p_tau_zero: float
    sigma_u: float
    slope_b: float
    slope_sd: float
    p_slope_sd_zero: float
    intercept_a: float
    wald_ci_s: list[float] | None
    loglik: dict[str, float]
    aic: dict[str, float]
    bic: dict[str, float]
    detection_share: float
    nodes: list[int]
    node_check: dict[str, Any] | None
    shape: dict[str, Any]
    converged: bool
    n_obs: int
    n_participants: int
    n_switches: int
    quadrature: str = "plain"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return asdict(self)

    def psi_quantiles_s(self, q: tuple[float, ...] = (0.1, 0.9)) -> list[float]:
        """Personal thresholds at population quantiles ``q`` (e^(c + τ·Φ⁻¹(q)))."""
        from scipy.stats import norm

        c = math.log(self.median_psi_s)
        return [math.exp(c + self.tau * float(norm.ppf(p))) for p in q]


def _data(df: pd.DataFrame) -> CycleData:
    need = ["participant_id", "wait_s", "switched"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise AnalysisInputError(f"cycle table lacks column(s) {', '.join(missing)}")
    d = df[need].dropna()
    w = d["wait_s"].to_numpy(float)
    if np.any(w <= 0):
        raise AnalysisInputError("wait_s must be > 0 seconds for every cycle")
    y = d["switched"].astype(float).to_numpy()
    if not np.isin(y, (0.0, 1.0)).all():
        raise AnalysisInputError("switched must be 0/1")
    pid = pd.factorize(d["participant_id"])[0]
    if len(y) < 20 or pid.max(initial=-1) < 1 or y.sum() in (0, len(y)):
        raise AnalysisInputError(
            "need >= 20 cycles from >= 2 participants with and without switches")
    return CycleData.from_arrays(np.log(w), y, pid)


def starts(data: CycleData) -> list[np.ndarray]:
    """Starting values of the main fit: the pooled-grid start and breakpoints at the lower and
    upper quartile of the log waits (the likelihood in c has several local maxima; other
    starts found better optima than the pooled one in issue 27)."""
    s0 = pooled_start(data)
    out = [s0]
    for q in (0.25, 0.75):
        s = s0.copy()
        s[2], s[3], s[4] = max(s0[2], 0.5), float(np.quantile(data.x, q)), 0.3
        out.append(s)
    return out


def pooled_start(data: CycleData) -> np.ndarray:
    """Starting values from the pooled hinge (profile over a coarse grid of c)."""
    from .pooled_fit import newton

    x, y = data.x, data.y
    grid = np.quantile(x, np.linspace(0.1, 0.9, 17))
    h = np.maximum(0.0, x[:, None] - grid[None, :])
    p0 = min(max(y.mean(), 1e-3), 1 - 1e-3)
    a, b, ll = newton(h, h * h, y @ h, np.ones_like(y), y, np.full(grid.size, math.log(
        p0 / (1 - p0))), np.zeros(grid.size))
    j = int(np.argmax(ll))
    return np.array([a[j], 0.3, max(b[j], 0.1), grid[j], 0.3])


def _fitter(adaptive: bool, model: RandomBreakpointModel) -> Callable[..., Fit]:
    """`maximize_adaptive` for a hinge under adaptive quadrature, else `maximize` (the smooth
    and flat comparison models have only the intercept effect, on the plain grid)."""
    return maximize_adaptive if adaptive and model.kind == "hinge" else maximize


def _start_job(data: CycleData, detection: float, nodes: tuple[int, ...],
               start: np.ndarray, adaptive: bool = False) -> Fit:
    """The main fit from one start (runs on a worker process)."""
    model = RandomBreakpointModel(data, nodes, detection=detection)
    return _fitter(adaptive, model)(model, start)


def _anchor(data: CycleData, detection: float, nodes: tuple[int, ...], best: Fit,
            adaptive: bool) -> tuple[RandomBreakpointModel, Fit, PersonNodes | None]:
    """The model the intervals are read from, the fit at its nodes, and those nodes (None on
    the plain grid). Under adaptive quadrature the nodes are centred at the estimate and
    the fit is repeated there, so the profile fits and ℓ̂ share one set of nodes."""
    model = RandomBreakpointModel(data, nodes, detection=detection)
    if not adaptive:
        return model, best, None
    start_adaptation(model, best.theta, rounds=3)
    return model, maximize(model, best.theta), model.person_nodes


def _job(kind: str, data: CycleData, detection: float, nodes: tuple[int, ...],
         best: Fit, arg: Any) -> Any:
    """One independent refit (runs on a worker process)."""
    kinds = {"end": "hinge", "check": "hinge", "tau0": "hinge_tau0",
             "two_groups": "hinge_two_groups"}
    model = RandomBreakpointModel(data, nodes, detection=detection, kind=kinds.get(kind, kind))
    if kind == "end":  # arg: the profile end, and the person nodes of adaptive quadrature
        k, side, guess, crit, lower, person_nodes = arg
        if person_nodes is not None:
            model.person_nodes = person_nodes
        return profile_endpoint(model, best, k, side, guess, crit, lower_bound=lower)[0]
    fit = _fitter(bool(arg), model)  # arg: adaptive quadrature or not
    if kind == "tau0":
        return fit(model, best.theta, fixed={4: 0.0})
    if kind == "check":
        return fit(model, best.theta)
    if kind == "two_groups":
        start = best.theta.copy()
        start[4] = max(start[4], 0.3)
        return fit(model, start)
    p = float(np.clip(data.y.mean(), 1e-3, 1 - 1e-3))
    start = np.array([math.log(p / (1 - p)), 0.3, 0.0 if kind == "flat" else 0.5, 0.0, 0.0])
    return fit(model, start)


def fit_personal_threshold(
    df: pd.DataFrame,
    *,
    detection_share: float = 1.0,
    nodes: tuple[int, ...] | None = None,
    level: float = 0.95,
    node_check: bool = True,
    intervals: bool = True,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    quadrature: str = "adaptive",
) -> PersonalThresholdResult:
    """Fit the random-breakpoint hinge to cycles (`participant_id`, `wait_s` > 0, `switched`).

    ``detection_share`` d: the share of real switches the switch rule counts (known, or
    estimated with `estimate_detection_share`); P(counted) = d·expit(η). ``node_check``
    refits with finer quadrature nodes and reports the relative changes. ``intervals``: the
    profile CIs of e^c and τ, the slowest refits (without them ``ci_s`` and ``tau_ci`` stay
    None until `add_intervals`). When people's slopes above the breakpoint differ
    (`_with_random_slope`), every fit has the random slope. ``quadrature`` "adaptive"
    centres each person's nodes on their posterior (`QUADRATURES`); ``nodes`` defaults to
    `DEFAULT_NODES` or `ADAPTIVE_NODES`."""
    if not 0 < detection_share <= 1:
        raise AnalysisInputError(
            f"detection share {detection_share!r} must be in (0, 1]; 1 = every switch counted")
    adaptive = _is_adaptive(quadrature)
    nodes = nodes or (ADAPTIVE_NODES if adaptive else DEFAULT_NODES)
    data = _data(df)
    best = max(run_jobs(_start_job, [(data, detection_share, nodes, s, adaptive)
                                     for s in starts(data)], workers), key=lambda f: f.loglik)
    best, nodes, slope = _with_random_slope(data, detection_share, best, nodes, workers,
                                            adaptive)
    model, best, person_nodes = _anchor(data, detection_share, nodes, best, adaptive)
    se = wald_se(model, best.theta)
    # The profile ends first: they are the longest jobs, the short ones fill in beside them.
    jobs = (_interval_jobs(data, detection_share, nodes, best, se, level, person_nodes)
            if intervals else [])
    jobs += [(kind, data, detection_share, nodes, best, adaptive)
             for kind in ("tau0", "smooth", "flat", "two_groups")]
    check_nodes = _check_nodes(nodes, adaptive)
    if node_check:
        jobs.append(("check", data, detection_share, check_nodes, best, adaptive))
    out = run_jobs(_job, jobs, workers, on_done=progress)
    ends = out[:4] if intervals else []
    tau0, smooth, flat, two, *checked = out[len(ends):]
    result = _result(data, best, nodes, slope, se, level, detection_share,
                     {"hinge": best.loglik, "hinge_tau0": tau0.loglik, "smooth": smooth.loglik,
                      "flat": flat.loglik}, two)
    result.quadrature = quadrature
    if checked:
        result.node_check = _check_summary(checked[0], best, check_nodes)
    if ends:
        _set_intervals(result, ends, level)
    return result


def _is_adaptive(quadrature: str) -> bool:
    if quadrature not in QUADRATURES:
        raise AnalysisInputError(f"quadrature {quadrature!r} is not one of "
                                 f"{', '.join(QUADRATURES)}")
    return quadrature == "adaptive"


def _result(data: CycleData, best: Fit, nodes: tuple[int, ...], p_slope: float,
            se: np.ndarray, level: float, detection: float, ll: dict[str, float], two: Fit
            ) -> PersonalThresholdResult:
    """The result of the main fit and its comparison fits, without the profile CIs."""
    tau_lr = max(0.0, 2 * (ll["hinge"] - ll["hinge_tau0"]))
    n = int(data.x.size)
    gain = float(two.loglik - best.loglik)
    z = math.sqrt(float(chi2.ppf(level, 1)))
    wald = None
    # A degenerate fit (a handful of waits) can have a standard error so large that the
    # interval's end overflows a float: no Wald interval then (the profile CI still stands).
    if np.isfinite(se[3]) and z * se[3] < 700:
        wald = [math.exp(best.theta[3] - z * se[3]), math.exp(best.theta[3] + z * se[3])]
    return PersonalThresholdResult(
        median_psi_s=math.exp(best.theta[3]), ci_s=None, tau=float(best.theta[4]),
        tau_ci=None, tau_lr=float(tau_lr),
        # Boundary LR test (Self & Liang 1987): ½χ²₀ + ½χ²₁ under τ = 0.
        p_tau_zero=1.0 if tau_lr <= 0 else 0.5 * float(chi2.sf(tau_lr, 1)),
        sigma_u=float(best.theta[1]), slope_b=float(best.theta[2]),
        slope_sd=float(best.theta[5]) if best.theta.size > 5 else 0.0,
        p_slope_sd_zero=p_slope, intercept_a=float(best.theta[0]), wald_ci_s=wald, loglik=ll,
        aic={m: 2 * _K[m] - 2 * v for m, v in ll.items()},
        bic={m: _K[m] * math.log(n) - 2 * v for m, v in ll.items()},
        detection_share=float(detection), nodes=list(nodes), node_check=None,
        shape={"loglik_gain_two_groups": gain,
               "two_groups_psi_s": [math.exp(two.theta[3] - two.theta[4]),
                                    math.exp(two.theta[3] + two.theta[4])],
               "lognormal_like": bool(gain <= SHAPE_MARGIN)},
        converged=bool(best.converged), n_obs=n, n_participants=data.n_participants,
        n_switches=int(data.y.sum()))


def _interval_jobs(data: CycleData, detection: float, nodes: tuple[int, ...], best: Fit,
                   se: np.ndarray, level: float, person_nodes: PersonNodes | None = None
                   ) -> list[tuple[Any, ...]]:
    """The four profile-end refits (c low, c high, τ low, τ high) as `_job` arguments."""
    crit = float(chi2.ppf(level, 1))
    # τ's lower end uses the boundary mixture ½χ²₀ + ½χ²₁ (its quantile at `level` is the
    # χ²₁ quantile at 2·level − 1), as the τ = 0 test does: the interval excludes 0 exactly
    # when that test rejects at 1 − level.
    crit_tau_lo = float(chi2.ppf(2 * level - 1, 1))
    z = math.sqrt(crit)

    def guess(k: int, side: int) -> float:
        s = se[k] if np.isfinite(se[k]) and se[k] > 0 else 0.1
        return float(best.theta[k] + side * z * s)

    ends = [(3, -1, crit, None), (3, 1, crit, None), (4, -1, crit_tau_lo, 0.0),
            (4, 1, crit, None)]
    return [("end", data, detection, nodes, best,
             (k, side, guess(k, side), c, lower, person_nodes))
            for k, side, c, lower in ends]


def _set_intervals(result: PersonalThresholdResult, ends: list[float], level: float) -> None:
    """Store the profile ends (c low, c high, τ low, τ high) as ``ci_s`` and ``tau_ci``."""
    c_lo, c_hi, t_lo, t_hi = ends
    if result.p_tau_zero >= 1 - level:
        t_lo = 0.0  # the test and the interval agree even where the two fits differ slightly
    result.ci_s = [math.exp(c_lo), math.exp(c_hi)]
    result.tau_ci = [float(max(0.0, t_lo)), float(t_hi)]


def add_intervals(df: pd.DataFrame, result: PersonalThresholdResult, *, level: float = 0.95,
                  workers: int | None = None, progress: ProgressFn | None = None
                  ) -> PersonalThresholdResult:
    """The profile CIs of a fit made without them (``intervals=False``), stored in
    ``result`` (the same cycles)."""
    data, nodes = _data(df), tuple(result.nodes)
    model, best, person_nodes = _anchor(data, result.detection_share, nodes, _as_fit(result),
                                        result.quadrature == "adaptive")
    se = wald_se(model, best.theta)
    jobs = _interval_jobs(data, result.detection_share, nodes, best, se, level, person_nodes)
    _set_intervals(result, run_jobs(_job, jobs, workers, on_done=progress), level)
    return result


def _check_nodes(nodes: tuple[int, ...] | list[int], adaptive: bool = False
                 ) -> tuple[int, ...]:
    """The quadrature check's nodes for a fit at ``nodes`` (with the random slope or not)."""
    if adaptive:
        return ADAPTIVE_CHECK_NODES if len(nodes) == 2 else ADAPTIVE_SLOPE_CHECK_NODES
    return CHECK_NODES if len(nodes) == 2 else SLOPE_CHECK_NODES


def _check_summary(f2: Fit, best: Fit, check_nodes: tuple[int, ...]) -> dict[str, Any]:
    return {"nodes": list(check_nodes),
            "rel_change_median_psi": float(math.expm1(f2.theta[3] - best.theta[3])),
            "abs_change_tau": float(f2.theta[4] - best.theta[4]),
            "loglik_change": float(f2.loglik - best.loglik)}


def quadrature_check(df: pd.DataFrame, result: PersonalThresholdResult) -> Background:
    """The quadrature check of a fit made without it, started on a process of its own: the
    hinge refitted with finer nodes (`CHECK_NODES`, or `SLOPE_CHECK_NODES` with the random
    slope) from ``result``'s estimate. ``check_summary(result, job.result())`` gives the
    relative changes; ``job.cancel()`` stops it when it is not needed."""
    adaptive = result.quadrature == "adaptive"
    return Background(_job, "check", _data(df), result.detection_share,
                      _check_nodes(result.nodes, adaptive), _as_fit(result), adaptive)


def check_summary(result: PersonalThresholdResult, refit: Fit) -> dict[str, Any]:
    """Store the quadrature check's changes (``refit``: the finer fit) in ``result``."""
    result.node_check = _check_summary(refit, _as_fit(result),
                                       _check_nodes(result.nodes, result.quadrature == "adaptive"))
    return result.node_check


def hinge_theta(result: PersonalThresholdResult) -> np.ndarray:
    """The fitted hinge's θ = (a, σ_u, b, c, τ[, κ]) (κ with the random slope)."""
    theta = np.array([result.intercept_a, result.sigma_u, result.slope_b,
                      math.log(result.median_psi_s), result.tau])
    return np.r_[theta, result.slope_sd] if len(result.nodes) > 2 else theta


def _as_fit(result: PersonalThresholdResult) -> Fit:
    return Fit(theta=hinge_theta(result), loglik=result.loglik["hinge"],
               converged=result.converged, n_evals=0)


def _with_random_slope(data: CycleData, detection: float, best: Fit, nodes: tuple[int, ...],
                       workers: int | None, adaptive: bool = False
                       ) -> tuple[Fit, tuple[int, ...], float]:
    """Do people's slopes above the breakpoint differ? The hinge refitted with a random slope
    (`SLOPE_NODES`, or `ADAPTIVE_SLOPE_NODES`) against the same hinge without it at the same
    nodes (worker jobs), by the boundary LR test (½χ²₀ + ½χ²₁). When its p is below
    `SLOPE_ALPHA` the random-slope fit replaces the main fit (otherwise slope differences push
    the median threshold up). Returns (fit, nodes, p of κ = 0)."""
    slope_nodes = ADAPTIVE_SLOPE_NODES if adaptive else SLOPE_NODES
    # Three jobs (no slope; κ from 0.3; κ from 0.8): the two κ starts are the long ones,
    # so on two workers they run side by side.
    plain, *rs_fits = run_jobs(_slope_job, [(data, detection, best, k, slope_nodes, adaptive)
                                            for k in (None, *KAPPA_STARTS)], workers)
    rs = max(rs_fits, key=lambda f: f.loglik)
    lr = max(0.0, 2 * (rs.loglik - plain.loglik))
    p = 1.0 if lr <= 0 else 0.5 * float(chi2.sf(lr, 1))
    if p < SLOPE_ALPHA:
        return rs, slope_nodes, p
    return best, nodes, p


def _slope_job(data: CycleData, detection: float, best: Fit, kappa: float | None,
               slope_nodes: tuple[int, ...] = SLOPE_NODES, adaptive: bool = False) -> Fit:
    """The hinge at ``slope_nodes`` from the main fit, with the random slope from κ =
    ``kappa`` (`KAPPA_STARTS`) or, for None, without it (runs on a worker process)."""
    if kappa is None:
        model = RandomBreakpointModel(data, slope_nodes[:2], detection=detection)
        return _fitter(adaptive, model)(model, best.theta)
    model = RandomBreakpointModel(data, slope_nodes, detection=detection)
    return _fitter(adaptive, model)(model, np.r_[best.theta, kappa])


def estimate_detection_share(counted: pd.Series, all_switches: pd.Series) -> float:
    """Share of switches the primary rule counts: switches it counts over switches counted by
    the most inclusive rule (e.g. ``switched_2s``), among the same cycles. 1.0 when no switch
    was seen at all."""
    n_all = float(pd.Series(all_switches).astype(float).sum())
    n_counted = float(pd.Series(counted).astype(float).sum())
    if n_all <= 0:
        return 1.0
    return float(min(1.0, max(n_counted / n_all, 1e-3)))


__all__ = [
    "PARAMS",
    "PersonalThresholdResult",
    "estimate_detection_share",
    "check_summary",
    "fit_personal_threshold",
    "hinge_theta",
    "quadrature_check",
]
