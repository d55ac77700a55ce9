"""Does a threshold beat the best explanation without one?
(docs/concepts/analysis.md#flow-threshold)

The random-breakpoint hinge (`rb_model`) is compared with no-threshold alternatives that have
the same random-effect flexibility (two person-level effects each):

* ``slopes``: logistic in log wait, people differing in intercept and slope (correlated:
  they are independent at a fitted pivot wait);
* ``hazard``: a background chance plus a constant hazard per second of waiting, people
  differing in background and rate (memoryless switching);
* ``spline``: a monotone smooth curve in log wait (non-negative I-spline increments,
  `spline_model`), people differing in level and in the scale of their rise;
* the same steady rises in the wait in *seconds* (`in_seconds`): ``seconds``, the
  ``slopes`` model in seconds (the odds grow by a constant factor per second rather than per
  doubling; people's slopes normal, so some may fall), and ``linear_seconds``, a straight
  rise in seconds whose size people scale (log-normally, as the spline's). On a log-wait
  axis both are flat, then ever steeper, and without them a logistic in seconds was called a
  threshold in 34 of 60 outside studies of 30 × 80; with them the hinge is still found at
  that size (docs/concepts/analysis.md#steady-in-seconds-flat-then-ever-steeper);
* the gradual onsets (`ONSETS`): ``rounded`` (`ROUNDED`), the hinge itself with its corner
  rounded over at least a factor `ONSET_FACTOR` of the wait, with the hinge's person
  effects; ``scurve`` (`SCURVE`, `scurve_model`), a floor, a rise and a ceiling along a
  logistic curve in log wait whose lower bend spans at least the same factor, with the
  spline's person effects; and ``spline_seconds``, the ``spline`` in seconds, which can
  also bend upwards. A study of 30 × 80 cannot tell them from a threshold (with all three,
  7 of 20 threshold studies of 30 × 80 were found), one of 60 × 160 can
  (docs/concepts/analysis.md), so by default they are among the alternatives from
  `ONSETS_FROM_CYCLES` cycles on (`includes_onsets`); without the rounded onset an
  increasing hazard, without the S-curve an S-shaped rise, passes the test at 60 × 160 as a
  threshold (at the foot of its rise).

"No threshold" is the union of the alternatives, so the hinge must beat each plausible one (an
intersection-union test, Berger 1982): every alternative within `CONTENDER_GAP` log-likelihood
units of the best (`contenders`) is a component, tested in turn, best first, until one stands;
p is the largest component p, and each component at α keeps the whole at α. A component's
statistic is T_k = ℓ_hinge − ℓ_k (marginal log-likelihoods at `TEST_NODES`); its null
distribution comes from alternative k itself, at the study's own design: the same participants,
waits and detection share, switches redrawn from the fitted k (new person effects each time),
hinge and k refitted (parametric bootstrap, Williams 1970; Cox 1962). Testing the best alone
was liberal where two alternatives fitted about equally and the best was the misspecified one
(four latency arms, docs/concepts/analysis.md). The hinge is fitted alike for the data and
every replicate (`fit_hinge`): from the main fit's θ, the pooled-grid start and a breakpoint
screened in another mode — a replicate fitted from fewer modes than the data would make the
test liberal.

Each component's replicates are drawn sequentially (Besag & Clifford 1991): drawing stops as
soon as the full component test could no longer reject at α — once h = `stop_count` replicates
reach T (with 19 replicates at α = 0.05, the first one that does) — with p = max(h / L, (1 + h)
/ (B + 1)) (h replicates ≥ T among the L drawn; the second term only matters where α(B + 1) is
not a whole number, and keeps p above α); otherwise all B are drawn and p = (1 + #{T* ≥ T}) /
(B + 1). So the verdict at α is the full test's exactly; only studies that do not reject stop
early — the no-threshold studies, whose alternatives are the slowest to refit — and their p is
coarse but valid (it is h / L's, Besag & Clifford's, or larger).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.special import expit

from .rb_model import (
    FTOL,
    FTOL_REFIT,
    MIN_BEND,
    ONSET_FACTOR,
    CycleData,
    Fit,
    HazardModel,
    RandomBreakpointModel,
    maximize,
)
from .scurve_model import LOWER_BEND_UNITS, SCurveModel
from .spline_model import SplineModel
from .workers import run_jobs, run_until

ROUNDED = "rounded"  # its narrowest bend: `rb_model.MIN_BEND` (`ONSET_FACTOR` of the wait)
SCURVE = "scurve"  # its narrowest bend: `scurve_model.MIN_WIDTH` (the same factor)
SECONDS = "seconds"
LINEAR_SECONDS = "linear_seconds"
SPLINE_SECONDS = "spline_seconds"
#: The steady rises, always alternatives: in log wait and (`SECONDS`, `LINEAR_SECONDS`) in
#: the wait in seconds.
ALTERNATIVES = ("slopes", "hazard", "spline", SECONDS, LINEAR_SECONDS)
#: The alternatives on the wait in seconds (fitted to `in_seconds`); the rest use log wait.
IN_SECONDS = (SECONDS, LINEAR_SECONDS, SPLINE_SECONDS)
#: The gradual-onset alternatives, tested together (`includes_onsets`).
ONSETS = (ROUNDED, SCURVE, SPLINE_SECONDS)
ALT_LABELS = {
    "rounded": (f"onset rounded over more than a factor {ONSET_FACTOR:g} of the wait (the "
                "hinge's person effects)"),
    SCURVE: (f"S-curve in log wait whose lower bend spans more than a factor {ONSET_FACTOR:g} "
             "of the wait (people differ in level and rise)"),
    "slopes": "logistic in log wait (people differ in intercept and slope)",
    SECONDS: "logistic in the wait in seconds (people differ in intercept and slope)",
    LINEAR_SECONDS: ("logistic in the wait in seconds (people differ in level and in the size "
                     "of their rise)"),
    "hazard": "background + constant hazard per second of waiting (people differ in rate)",
    "spline": "monotone smooth curve in log wait (people differ in level and rise)",
    SPLINE_SECONDS: ("monotone smooth curve in the wait in seconds (people differ in level "
                     "and rise)"),
}
AnyModel = RandomBreakpointModel | HazardModel | SplineModel | SCurveModel
#: Quadrature nodes of the test's fits (the same for the data and every replicate, so the
#: test is calibrated whatever the quadrature error of the statistic).
TEST_NODES = (12, 5)
#: With a random slope above the breakpoint (a 6-entry hinge θ): 5 nodes for the slope.
SLOPE_TEST_NODES = (12, 5, 5)
#: The work arrays of the test's hinge, rounded onset and logistic-slopes fits: float32
#: (sums over cycles stay float64). Same for the data and every replicate, so the test stays
#: calibrated; at 100 × 200 it moved T* by at most 6e-6 in four `hinge_strong` replicates and
#: cut their time by a third (numpy's float32 exp and log are 2–3x faster here).
TEST_DTYPE = np.float32
#: Where `screened_start` tries the hinge's breakpoint: quantiles of the log waits.
SCREEN_QUANTILES = np.linspace(0.05, 0.95, 13)
#: ... at least this far (in log wait, a factor 1.35) from the first start's breakpoint.
SCREEN_AWAY = 0.3
#: A threshold must beat, one by one, every alternative whose log-likelihood is within this of
#: the best one's (`contenders`): "no threshold" is the union of the alternatives, so the
#: claim needs each plausible one rejected (an intersection-union test, Berger 1982; each
#: component at α keeps the whole at α). The best alone was liberal where two fitted about
#: equally: a logistic in seconds with normal slopes, misspecified for log-normal ones, drew
#: a null too low (docs/concepts/analysis.md, "Four latency arms").
CONTENDER_GAP = 2.0
#: The level of the threshold test (and of the existence test) in the verdict.
ALPHA = 0.05
#: From this many cycles (60 × 160) the gradual onsets are alternatives by default. Of the
#: two sizes measured, 30 × 80 could not tell them from the hinge and 60 × 160 could (sizes
#: between, and other splits of the same count, are not measured).
ONSETS_FROM_CYCLES = 9_600


def includes_onsets(onsets: bool | None, n_cycles: int) -> bool:
    """Whether the test includes the gradual onsets (`ONSETS`): as asked, or (None) from
    `ONSETS_FROM_CYCLES` cycles on."""
    return n_cycles >= ONSETS_FROM_CYCLES if onsets is None else onsets


def onsets_tested(test: dict[str, Any]) -> bool:
    """Whether a test's JSON (`ThresholdTest.to_dict`) had the gradual onsets among its
    alternatives."""
    return set(ONSETS) <= set(test.get("loglik") or {})


def stop_count(n_max: int, alpha: float = ALPHA) -> int:
    """Replicates reaching T after which the full test of ``n_max`` replicates can no longer
    reject at ``alpha``: the smallest h with (1 + h) / (n_max + 1) > alpha."""
    return max(1, math.floor(alpha * (n_max + 1) + 1e-9))


def hinge_nodes(theta: np.ndarray | None) -> tuple[int, ...]:
    """The test hinge's nodes: with the random slope when the main fit has one (θ has κ), so
    the hinge is tested as it is reported and, like the spline, lets people's rises differ."""
    return SLOPE_TEST_NODES if theta is not None and len(theta) > 5 else TEST_NODES


def make_model(kind: str, data: CycleData, detection: float,
               nodes: tuple[int, ...] = TEST_NODES) -> AnyModel:
    """The model object of ``kind`` ("hinge", "slopes", "seconds", "linear_seconds",
    "hazard", "spline", "spline_seconds", "rounded" or "scurve")."""
    if kind == SECONDS:  # the slopes model on the wait in seconds
        return RandomBreakpointModel(in_seconds(data), nodes, detection=detection,
                                     kind="slopes", dtype=TEST_DTYPE)
    if kind == "hazard":
        return HazardModel(data, nodes, detection=detection)
    if kind in ("spline", SPLINE_SECONDS, LINEAR_SECONDS):
        return SplineModel(axis(kind, data), nodes, detection=detection,
                           linear=kind == LINEAR_SECONDS)
    if kind == SCURVE:
        return SCurveModel(data, nodes, detection=detection)
    return RandomBreakpointModel(data, nodes, detection=detection, kind=kind, dtype=TEST_DTYPE)


def in_seconds_of(logw: np.ndarray, data: CycleData) -> np.ndarray:
    """Log waits as `in_seconds` measures them: seconds over the data's geometric mean wait
    (so slopes and the pivot are of order 1 whatever the study's waits)."""
    return np.exp(np.asarray(logw, float) - float(data.x.mean()))


def in_seconds(data: CycleData) -> CycleData:
    """The cycles with the wait in seconds (`in_seconds_of`) in place of the log wait."""
    return CycleData(x=in_seconds_of(data.x, data), y=data.y, starts=data.starts,
                     n_participants=data.n_participants)


def axis(kind: str, data: CycleData) -> CycleData:
    """The cycles as alternative ``kind`` sees them: in seconds (`IN_SECONDS`) or log wait."""
    return in_seconds(data) if kind in IN_SECONDS else data


def alternative_nodes(kind: str, hinge_theta: np.ndarray | None) -> tuple[int, ...]:
    """The rounded onset carries the test hinge's nodes (and random slope); the rest
    `TEST_NODES`."""
    return hinge_nodes(hinge_theta) if kind == ROUNDED else TEST_NODES


def alternative_starts(kind: str, data: CycleData,
                       hinge: np.ndarray | None = None) -> list[np.ndarray]:
    """Starting values for an alternative: from the overall switch rate (the rounded onset:
    from the fitted hinge, narrow and wide; the S-curve: two midpoints)."""
    if kind == ROUNDED:
        h = np.asarray(hinge if hinge is not None else pooled_hinge(data), float)
        return [np.r_[h, MIN_BEND], np.r_[h, 1.0]]
    p = float(np.clip(data.y.mean(), 1e-3, 1 - 1e-3))
    if kind == SECONDS:  # pivot at the mean wait (1 in these units), a mild rise
        return [np.array([math.log(p / (1 - p)), 0.3, 0.3, 1.0, 0.2])]
    if kind == "hazard":
        lam = -math.log(1 - p) / float(np.exp(data.x).mean())
        return [np.array([math.log(p / (1 - p)) - 1.0, 0.3, math.log(lam), 0.0, 0.3])]
    if kind in ("spline", SPLINE_SECONDS):
        return [np.array([math.log(p / (1 - p)) - 1.0, 0.3, 0.3, 1.0, 1.0])]
    if kind == LINEAR_SECONDS:
        return [np.array([math.log(p / (1 - p)) - 1.0, 0.3, 0.3, 2.0])]
    if kind == SCURVE:  # midpoint at the median and at the upper quartile of the waits
        return [np.array([math.log(p / (1 - p)) - 1.5, 0.3, 0.3, 3.0, float(c), 1.0])
                for c in np.quantile(data.x, [0.5, 0.75])]
    return [np.array([math.log(p / (1 - p)), 0.3, 0.5, float(data.x.mean()), 0.3])]


def best_fit(model: AnyModel, starts: list[np.ndarray], ftol: float = FTOL) -> Fit:
    """The best of L-BFGS-B runs from several starts (the likelihoods are not concave)."""
    fits = [maximize(model, s, ftol=ftol) for s in starts]
    return max(fits, key=lambda f: f.loglik)


def pooled_hinge(data: CycleData) -> np.ndarray:
    """The pooled-grid hinge start (`personal_threshold.pooled_start`)."""
    from .personal_threshold import pooled_start

    return pooled_start(data)


def hinge_starts(data: CycleData, theta: np.ndarray | None) -> list[np.ndarray]:
    """Starts for the hinge: the given θ (e.g. the main fit) and the pooled-grid start."""
    out = [pooled_hinge(data)]
    if theta is not None:
        out.insert(0, np.asarray(theta, float))
    return out


def screened_start(model: AnyModel, theta: np.ndarray) -> np.ndarray | None:
    """A start in another mode: θ with its breakpoint c moved to the `SCREEN_QUANTILES`
    point of the log waits, at least `SCREEN_AWAY` from θ's c, where −ℓ is lowest (the
    other parameters held); None when there is no such point."""
    grid = np.quantile(model.d.x, SCREEN_QUANTILES)
    far = grid[np.abs(grid - float(theta[3])) >= SCREEN_AWAY]
    if far.size == 0:
        return None
    nll = [model.nll(np.r_[theta[:3], c, theta[4:]], need_grad=False)[0] for c in far]
    return np.r_[theta[:3], float(far[int(np.argmin(nll))]), theta[4:]]


def fit_hinge(model: AnyModel, starts: list[np.ndarray], ftol: float = FTOL) -> Fit:
    """The hinge's best fit from ``starts`` and from the first one's screened breakpoint
    (`screened_start`). Its likelihood can have a mode per gap between wait levels (a
    study of a few latency arms); the data's hinge starts from the main fit's optimum, so a
    replicate refitted from fewer modes than the data would be biased low and the test
    liberal. It is one cause, not the whole: an outside logistic in seconds with four arms
    was called a threshold in 8 of 37 studies of 30 × 80 before it, 7 of 40 after
    (docs/concepts/analysis.md#steady-in-seconds-flat-then-ever-steeper)."""
    screened = screened_start(model, np.asarray(starts[0], float))
    return best_fit(model, starts if screened is None else [*starts, screened], ftol)


def simulate_alternative(kind: str, theta: np.ndarray, data: CycleData, detection: float,
                         rng: np.random.Generator) -> np.ndarray:
    """Switch flags drawn from a fitted alternative at the data's own design."""
    a, su, b = (float(theta[k]) for k in (0, 1, 2))
    tau = float(theta[4]) if len(theta) > 4 else 0.0  # the scaled rises' τ is b (θ[2])
    sizes = np.diff(np.r_[data.starts, data.x.size])
    v = np.repeat(rng.standard_normal(data.n_participants), sizes)
    z = np.repeat(rng.standard_normal(data.n_participants), sizes)
    if kind == "hazard":
        bg = expit(a + su * v)
        p = 1 - (1 - bg) * np.exp(-np.exp(b + tau * z) * np.exp(data.x))
    elif kind == ROUNDED:  # θ = (a, σ_u, b, c, τ[, κ], ω)
        c, omega = float(theta[3]), float(theta[-1])
        rise = b * omega * np.logaddexp(0.0, (data.x - c - tau * z) / omega)
        if len(theta) > 6:
            rise *= np.exp(float(theta[5]) * np.repeat(
                rng.standard_normal(data.n_participants), sizes))
        p = expit(a + su * v + rise)
    elif kind in ("spline", SPLINE_SECONDS, LINEAR_SECONDS, SCURVE):  # θ = (a, σ_u, τ, ρ…)
        seen = axis(kind, data)
        shape = SCurveModel(seen) if kind == SCURVE else SplineModel(
            seen, linear=kind == LINEAR_SECONDS)
        rise = shape.curve(theta, seen.x) - a
        p = expit(a + su * v + np.exp(b * z) * rise)
    else:  # slopes, or seconds: the same model on the wait in seconds
        x = axis(kind, data).x
        p = expit(a + su * v + (b + tau * z) * (x - float(theta[3])))
    return (rng.random(data.x.size) < detection * p).astype(float)


def _fit_job(kind: str, data: CycleData, detection: float, nodes: tuple[int, ...],
             starts: list[np.ndarray]) -> Fit:
    """One of the test's fits to the data (runs on a worker process)."""
    model = make_model(kind, data, detection, nodes)
    return fit_hinge(model, starts) if kind == "hinge" else best_fit(model, starts)


def _replicate(kind: str, theta_alt: np.ndarray, theta_hinge: np.ndarray, data: CycleData,
               detection: float, seed: int) -> float:
    """One null replicate's T* = ℓ_hinge* − ℓ_alt* (runs on a worker process)."""
    rng = np.random.default_rng(seed)
    y = simulate_alternative(kind, theta_alt, data, detection, rng)
    if y.sum() in (0, y.size):
        return 0.0  # nothing to fit: neither model can win
    sim = CycleData(x=data.x, y=y, starts=data.starts, n_participants=data.n_participants)
    alt = best_fit(make_model(kind, sim, detection, alternative_nodes(kind, theta_hinge)),
                   [theta_alt], FTOL_REFIT)
    hinge = fit_hinge(make_model("hinge", sim, detection, hinge_nodes(theta_hinge)),
                      hinge_starts(sim, theta_hinge), FTOL_REFIT)
    return hinge.loglik - alt.loglik


@dataclass
class ThresholdTest:
    """Outcome of `threshold_test` (JSON-ready via `to_dict`)."""

    best: str
    label: str
    loglik: dict[str, float]
    params: dict[str, list[float]]
    stat: float
    p_value: float
    n_boot: int  # replicates drawn
    n_max: int  # replicates the full test draws
    nodes: list[int]
    summary: str
    null_stats: list[float] = field(repr=False, default_factory=list)  # the best's
    #: p of each component tested (`contenders`, best first, up to the first that stands)
    components: dict[str, float] = field(default_factory=dict)

    @property
    def standing(self) -> str:
        """The alternative the hinge beat least surely (the largest component p)."""
        return max(self.components, key=lambda k: self.components[k]) if self.components \
            else self.best

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the replicate statistics)."""
        d = asdict(self)
        d.pop("null_stats")
        d["standing"] = self.standing
        return d


def threshold_test(data: CycleData, detection: float, hinge_theta: np.ndarray | None, *,
                   n_boot: int = 39, seed: int = 0, workers: int | None = None,
                   progress: Any = None, onsets: bool | None = None, alpha: float = ALPHA
                   ) -> ThresholdTest:
    """Test the random-breakpoint hinge against each no-threshold alternative within
    `CONTENDER_GAP` of the best, by a parametric bootstrap from that alternative (module
    docstring); ``onsets`` adds the gradual onsets to the alternatives (None:
    `includes_onsets`); drawing stops once a component cannot reject at ``alpha``."""
    kinds = ALTERNATIVES + (ONSETS if includes_onsets(onsets, data.x.size) else ())
    nodes = hinge_nodes(hinge_theta)
    fit_jobs: list[tuple[Any, ...]] = [
        (k, data, detection, alternative_nodes(k, hinge_theta),
         alternative_starts(k, data, hinge_theta)) for k in kinds]
    fit_jobs.append(("hinge", data, detection, nodes, hinge_starts(data, hinge_theta)))
    *alts, hinge = run_jobs(_fit_job, fit_jobs, workers)
    fits = dict(zip(kinds, alts, strict=True))
    order = contenders({k: f.loglik for k, f in fits.items()}, CONTENDER_GAP)
    best = order[0]
    components: dict[str, float] = {}
    drawn = 0
    best_null: list[float] = []
    for i, kind in enumerate(order):  # the best first; stop at the first that stands
        # The best's replicates keep the seeds of the one-alternative test (its verdict at
        # the first component is that test's).
        entropy = seed if i == 0 else [seed, i]
        stat_k = hinge.loglik - fits[kind].loglik
        null = _component_null(kind, fits[kind].theta, hinge, stat_k, data, detection,
                               entropy, n_boot, alpha, workers, progress)
        best_null = null if i == 0 else best_null
        drawn += len(null)
        components[kind] = sequential_p(null, stat_k, n_boot, stop_count(n_boot, alpha))
        if components[kind] > alpha:
            break
    stat = hinge.loglik - fits[best].loglik
    return ThresholdTest(
        best=best, label=ALT_LABELS[best],
        loglik={"hinge": hinge.loglik, **{k: f.loglik for k, f in fits.items()}},
        params={"hinge": [float(t) for t in hinge.theta],
                **{k: [float(t) for t in f.theta] for k, f in fits.items()}},
        stat=float(stat), p_value=float(max(components.values())), n_boot=drawn,
        n_max=n_boot * len(order), nodes=list(nodes),
        summary=describe_alternative(best, fits[best].theta, data), null_stats=best_null,
        components=components)


def contenders(loglik: dict[str, float], gap: float = CONTENDER_GAP) -> list[str]:
    """The alternatives the hinge must beat one by one: every one within ``gap`` of the best
    log-likelihood, best first."""
    ranked = sorted(loglik, key=lambda k: -loglik[k])
    return [k for k in ranked if loglik[ranked[0]] - loglik[k] <= gap]


def _component_null(kind: str, theta: np.ndarray, hinge: Fit, stat: float, data: CycleData,
                    detection: float, entropy: int | list[int], n_boot: int, alpha: float,
                    workers: int | None, progress: Any) -> list[float]:
    """The replicate statistics of one component (the hinge against ``kind``, its T =
    ``stat``, the null drawn from ``kind`` at ``theta``), drawn until the component can no
    longer reject at ``alpha`` or all ``n_boot`` are in."""
    seeds = np.random.SeedSequence(entropy).generate_state(n_boot)
    jobs = [(kind, theta, hinge.theta, data, detection, int(s)) for s in seeds]
    stop = stop_count(n_boot, alpha)
    return [float(t) for t in run_until(_replicate, jobs,
                                        lambda got: _exceed(got, stat) >= stop,
                                        workers, on_done=progress)]


def _exceed(null: list[float], stat: float) -> int:
    return sum(t >= stat - 1e-9 for t in null)


def sequential_p(null: list[float], stat: float, n_max: int, stop: int) -> float:
    """Besag–Clifford p-value of replicates drawn until ``stop`` of them reach ``stat`` (or
    all ``n_max``): max(h / L, (1 + h) / (n_max + 1)) when stopped, else (1 + #{T* ≥ T}) /
    (n_max + 1)."""
    h = _exceed(null, stat)
    if h >= stop:
        return max(h / len(null), (1 + h) / (n_max + 1))
    return (1 + h) / (n_max + 1)


def _pct(x: float) -> str:
    """A percentage with two significant digits, never in e-notation."""
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.2g}"


def _odds_per_second(per_s: float) -> str:
    """A rise linear in seconds (``per_s`` on the logit per second) in words."""
    step = 10.0 if abs(math.expm1(per_s)) < 0.05 else 1.0
    return (f"switching rises steadily with the wait: the odds of switching grow about "
            f"{_pct(100 * math.expm1(per_s * step))} % with every extra "
            f"{'10 seconds' if step == 10 else 'second'} of waiting (logistic in the wait in "
            "seconds, the typical person)")


def describe_alternative(kind: str, theta: np.ndarray, data: CycleData) -> str:
    """The no-threshold finding in words, with its size at the typical person."""
    a, b = float(theta[0]), float(theta[2])
    if kind == ROUNDED:
        width = math.exp(2 * math.log(9) * float(theta[-1]))
        return (f"switching rises from a gradual onset around {math.exp(float(theta[3])):.3g} s "
                f"rather than at a threshold: the typical person's rise sets in over a factor "
                f"of about {_pct(width)} of the wait (a rounded onset)")
    if kind == SCURVE:
        floor, ceiling = expit(a), expit(a + float(theta[3]))
        width = math.exp(LOWER_BEND_UNITS * float(theta[5]))
        return (f"switching rises along an S-curve rather than at a threshold: for the typical "
                f"person from {_pct(100 * floor)} % to {_pct(100 * ceiling)} %, half of the rise "
                f"reached at {math.exp(float(theta[4])):.3g} s, its lower bend spread over a "
                f"factor of about {_pct(width)} of the wait (an S-curve in log wait)")
    if kind in ("spline", SPLINE_SECONDS):
        seen = axis(kind, data)
        lo, hi = np.quantile(data.x, [0.25, 0.75])  # the quartiles of the log wait
        at = np.array([lo, hi]) if kind == "spline" else in_seconds_of(np.array([lo, hi]), data)
        p_lo, p_hi = expit(SplineModel(seen).curve(theta, at))
        scale = "log wait" if kind == "spline" else "the wait in seconds"
        return (f"switching rises steadily with the wait, without a breakpoint: for the typical "
                f"person from {_pct(100 * p_lo)} % at {math.exp(lo):.3g} s to "
                f"{_pct(100 * p_hi)} % at {math.exp(hi):.3g} s (a monotone curve in {scale})")
    if kind == "hazard":
        lam = math.exp(b)
        return (f"switching rises steadily with the wait: each extra second of waiting adds "
                f"about {_pct(100 * lam)} % chance of switching (a constant hazard, the typical "
                f"person; background {_pct(100 * float(expit(a)))} %)")
    gm = math.exp(float(data.x.mean()))  # the seconds alternatives' unit of wait
    if kind == SECONDS:  # b is per geometric-mean wait
        return _odds_per_second(b / gm)
    if kind == LINEAR_SECONDS:  # δ over the waits' range, in geometric-mean waits
        secs = in_seconds(data).x
        return _odds_per_second(float(theta[3]) / (float(secs.max() - secs.min()) * gm))
    odds = 2.0 ** b
    return (f"switching rises steadily with the wait: the odds of switching grow about "
            f"{_pct(100 * (odds - 1))} % with every doubling of the wait (logistic in log wait, "
            "the typical person)")


__all__ = ["ALPHA", "ALTERNATIVES", "CONTENDER_GAP", "LINEAR_SECONDS", "MIN_BEND", "ONSETS",
           "ONSETS_FROM_CYCLES", "ONSET_FACTOR", "ROUNDED", "SCREEN_AWAY",
           "SCREEN_QUANTILES", "SCURVE", "SECONDS", "SPLINE_SECONDS", "TEST_NODES",
           "ThresholdTest", "contenders", "describe_alternative", "fit_hinge", "in_seconds",
           "includes_onsets", "onsets_tested", "screened_start", "sequential_p",
           "simulate_alternative", "stop_count", "threshold_test"]
