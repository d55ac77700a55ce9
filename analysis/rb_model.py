"""The random-breakpoint hinge model behind the personal flow threshold (issue 16).

The pooled hinge (`analysis.threshold`) estimates ψ*, the onset of the population-averaged
switch curve, which lies below the typical person's threshold whenever people differ. This
module estimates the typical person directly:

    logit p_ij = a + σ_u·v_i + b·e^(κ·s_i)·(log w_ij − c − τ·z_i)₊,    z_i, v_i, s_i ~ N(0, 1)

so person i has threshold ψ_i = e^(c + τ·z_i): e^c is the **median personal threshold** and τ
the between-person log-sd; κ lets people's rise above their threshold differ (optional: a
third node count turns it on). When the switch rule misses a known (or estimated) share of
switches, P(counted switch) = d·expit(η) with detection share d.

Fitting: marginal maximum likelihood; each person's likelihood is integrated over (z, v) by
Gauss–Hermite quadrature (product rule, `nodes` = (n_z, n_v[, n_s])), maximised by L-BFGS-B with the
analytic gradient (the posterior-weighted score). Intervals are profile-likelihood intervals
(the signed root of the profile LR is found by secant steps from the Wald guess), which keep
their coverage where Wald intervals do not (random intercepts, small τ). τ = 0 is tested by
the boundary LR test: LR against the τ = 0 fit, referred to ½χ²₀ + ½χ²₁.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, logsumexp

from . import AnalysisInputError
from .hinge_kernel import PersonNodes, adapted, hinge_nll, posterior_moments
from .switch_loglik import log_p, row_sums, weight_rows

PARAMS = ("a", "sigma_u", "b", "c", "tau", "kappa")
#: The rounded onset's narrowest bend: a person's slope goes from 10 % to 90 % of its full
#: value over at least this factor of the wait (ω ≥ ln F / (2 ln 9) in log wait).
ONSET_FACTOR = 9.0
MIN_BEND = math.log(ONSET_FACTOR) / (2 * math.log(9))
_BOUNDS = [(-15.0, 15.0), (0.0, 5.0), (-20.0, 40.0), (None, None), (0.0, 3.0)]
#: `maximize`'s relative tolerance on −ℓ per iteration: 4e-7 log-likelihood units at 20,000
#: cycles.
FTOL = 1e-10
#: For refits whose log-likelihood matters only to ~1e-3 (the threshold test's replicates,
#: the profile ends' fits — their root is found to 0.02 — and adaptive quadrature's rounds,
#: which stop at a change of 0.01): 100x `FTOL`, 10–15 % fewer evaluations. At 100 × 200 it
#: moved replicate statistics by at most 3e-5.
FTOL_REFIT = 1e-8


def gh_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss–Hermite nodes and log weights for E[f(Z)], Z ~ N(0, 1).

    Nodes with weight below 1e-9 are dropped (24 nodes keep 19): a person's posterior would
    need a likelihood ratio of ~1e7 between the tail and the centre for them to matter, and
    every node costs a pass over the cycles."""
    if n <= 1:
        return np.zeros(1), np.zeros(1)
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    keep = w >= 1e-9
    return x[keep], np.log(w[keep])


def check_detection(detection: float) -> float:
    """The detection share as a float, or a one-line error when it is not in (0, 1]."""
    if not 0 < detection <= 1:
        raise AnalysisInputError(f"detection share {detection!r} must be in (0, 1]")
    return float(detection)


def two_effect_grid(nodes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes of two person effects z and v, and the log weights of their grid (z-major)."""
    z, lwz = gh_nodes(nodes[0])
    v, lwv = gh_nodes(nodes[1])
    return z, v, (lwz[:, None] + lwv[None, :]).ravel()


@dataclass
class CycleData:
    """Cycles sorted by participant: log wait `x`, switch flag `y`, participant row starts."""

    x: np.ndarray
    y: np.ndarray
    starts: np.ndarray
    n_participants: int

    @classmethod
    def from_arrays(cls, logw: np.ndarray, y: np.ndarray, pid: np.ndarray) -> CycleData:
        order = np.argsort(pid, kind="stable")
        p = np.asarray(pid)[order]
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        return cls(x=np.asarray(logw, float)[order], y=np.asarray(y, float)[order],
                   starts=starts, n_participants=int(starts.size))

    @property
    def ends(self) -> np.ndarray:
        """Each participant's row end (exclusive): the next one's start, or the last row."""
        return np.r_[self.starts[1:], self.x.size]

    def subset(self, people: np.ndarray) -> CycleData:
        """The cycles of the given participants (indices into 0..P-1; repeats allowed)."""
        ends = self.ends
        idx = np.concatenate([np.arange(self.starts[i], ends[i]) for i in people])
        sizes = ends[people] - self.starts[people]
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        return CycleData(self.x[idx], self.y[idx], starts, int(len(people)))


class HazardModel:
    """Negative marginal log-likelihood of the memoryless alternative: a background chance of
    switching plus a constant hazard per second of waiting, with person-level rates,

        P(switch | w) = 1 − (1 − expit(a + σ_u·v))·exp(−e^(b + τ·z)·w),   z, v ~ N(0, 1),

    so each extra second carries the same chance e^(b+τz) (per second) of leaving. θ has the
    hinge's layout (a, σ_u, b, c, τ), c unused. Detection share d as in the hinge."""

    kind = "hazard"

    def __init__(self, data: CycleData, nodes: tuple[int, ...] = (12, 7), *,
                 detection: float = 1.0) -> None:
        self.d = data
        self.detection = check_detection(detection)
        self.z, self.v, self.log_w = two_effect_grid(nodes)
        self.w = np.exp(data.x)
        y1 = data.y > 0.5
        self.sign = np.where(y1, 1.0, -1.0)[:, None]
        self.c0 = np.where(y1, 0.0, 1.0)[:, None]
        q = self.z.size * self.v.size
        self._buf = [np.empty((data.x.size, q)) for _ in range(3)]
        self.ends = data.ends
        self.bounds: list[tuple[float | None, float | None]] = [
            (-15.0, 15.0), (0.0, 5.0), (-15.0, 5.0), (0.0, 0.0), (0.0, 3.0)]
        self.n_evals = 0

    def nll(self, theta: np.ndarray, need_grad: bool = True) -> tuple[float, np.ndarray]:
        """(−ℓ, −∂ℓ/∂θ) at θ = (a, σ_u, b, c, τ).

        With e = exp(−κ) = exp(−λw)·exp(−softplus(η₀)) (separable, so one exp over cycles ×
        rate nodes) and q = 1 − e: P(counted switch) = d·q, P(no count) = 1 − d·q; both are
        c₀ + s·d·q with s = ±1, and ∂log P/∂κ = s·d·e/P."""
        self.n_evals += 1
        a, su, b, _, tau = (float(t) for t in theta)
        eta0 = a + su * self.v  # (nv,)
        lam = np.exp(np.clip(b + tau * self.z, -50.0, 30.0))  # (nz,)
        wl = self.w[:, None] * lam[None, :]  # (N, nz)
        n, nz, nv = wl.shape[0], lam.size, self.v.size
        q, m, tmp = self._buf
        q3 = q.reshape(n, nz, nv)
        np.multiply(np.exp(-wl)[:, :, None], np.exp(-np.logaddexp(0.0, eta0))[None, None, :],
                    out=q3)  # e
        np.subtract(1.0, q, out=q)  # q = 1 − e
        d = self.detection
        np.multiply(q, self.sign * d, out=m)
        m += self.c0
        np.maximum(m, 1e-300, out=m)
        np.log(m, out=tmp)
        per = row_sums(tmp, self.d.starts, self.ends) + self.log_w
        tot = logsumexp(per, axis=1)
        f = -float(tot.sum())
        if not need_grad:
            return f, np.zeros(5)
        np.subtract(1.0, q, out=tmp)  # e
        tmp *= self.sign * d
        tmp /= m  # ∂log P/∂κ
        weight_rows(tmp, np.exp(per - tot[:, None]), self.d.starts, self.ends)  # posterior
        r3 = tmp.reshape(n, nz, nv)
        s0 = expit(eta0)  # ∂κ/∂a
        rv = r3.sum(axis=(0, 1))  # (nv,)
        rz = r3.sum(axis=2) * wl  # (N, nz): ∂ℓ/∂log λ per node
        g = np.array([float(rv @ s0), float(rv @ (s0 * self.v)), float(rz.sum()), 0.0,
                      float(rz.sum(axis=0) @ self.z)])
        return f, -g


class RandomBreakpointModel:
    """Negative marginal log-likelihood and gradient of the random-breakpoint hinge.

    ``kind`` "hinge" is the full model; "smooth" replaces the hinge by b·(log w − x̄) and
    "flat" drops it (both with the random intercept, for the model comparison); "slopes" is
    the no-threshold alternative with the hinge's random-effect flexibility: logistic in log
    wait with a random intercept and a random slope, η = a + σ_u·v + (b + τ·z)·(log w − c)
    (τ is the slopes' sd; c is the pivot wait at which intercept and slope are uncorrelated,
    so the three of σ_u, τ, c span any intercept–slope covariance).

    With three node counts ``nodes`` = (n_z, n_v, n_s) and n_s > 1 the hinge also gets a
    random slope above the breakpoint (issue 27): person i rises with slope b·e^(κ·s_i),
    s_i ~ N(0, 1), and θ gains a sixth entry κ (the slopes' log-sd). Without it, people's
    slope differences load onto τ and push the median threshold up (+114 % in issue 27).

    ``kind`` "rounded" is the hinge with its corner rounded: max(0, u) becomes ω·softplus(u/ω)
    (u = log w − c − τ·z), the breakpoint turned into an onset of width ω ≥ ``min_bend``,
    θ's last entry (the threshold test's rounded-onset alternative).

    The (cycles × nodes) work arrays are allocated once: allocating them per evaluation
    made the kernel map and unmap fresh pages every time (half the run time was system
    time)."""

    def __init__(self, data: CycleData, nodes: tuple[int, ...] = (24, 7), *,
                 detection: float = 1.0, kind: str = "hinge",
                 dtype: type = np.float64, min_bend: float = MIN_BEND,
                 dense: bool = False) -> None:
        self.d = data
        self.kind = kind
        # The hinge is computed where it is active (`hinge_kernel`); ``dense`` keeps the
        # full (cycles × nodes) pass, the reference it is tested against.
        self.dense = dense
        self.detection = check_detection(detection)
        # "hinge_tau0": everyone shares the breakpoint, so z drops out (one node).
        nz, nv = nodes[:2] if kind in ("hinge", "slopes", "rounded") else (1, nodes[1])
        ns = nodes[2] if len(nodes) > 2 and kind.startswith(("hinge", "rounded")) else 1
        if kind == "hinge_tau0":
            kind = self.kind = "hinge"
        self.z, lwz = gh_nodes(nz)
        self.two_groups = kind == "hinge_two_groups"
        if kind == "hinge_two_groups":
            # Two equal groups at c ± τ instead of log-normal thresholds (the shape check).
            kind = self.kind = "hinge"
            self.z, lwz = np.array([-1.0, 1.0]), np.log([0.5, 0.5])
        self.v, lwv = gh_nodes(nv)
        self.s, lws = gh_nodes(ns)
        # Node order (v, z, s): the (Q,) axis reshapes to (n_v, n_z, n_s). With v outermost the
        # intercept is added, and summed out of the score, along contiguous runs of n_z·n_s.
        self.log_w = (lwv[:, None, None] + lwz[None, :, None] + lws[None, None, :]).ravel()
        # float32 work arrays (the threshold test's, `threshold_test.TEST_DTYPE`) are a third
        # faster since the exp-based `switch_loglik`; sums over cycles are float64 either way.
        self.dtype = dtype
        self.sign: np.ndarray = (2.0 * data.y - 1.0)[:, None].astype(dtype)
        self.no_switch: np.ndarray = (data.y <= 0.5).astype(dtype)[:, None]
        self.y1: np.ndarray = data.y > 0.5
        self.ends = data.ends
        self.person_of_row = np.repeat(np.arange(data.n_participants), self.ends - data.starts)
        self.xc = float(data.x.mean())
        # The median threshold stays inside the observed waits (beyond them it is not
        # identified, and e^c would overflow under a flat truth).
        self.bounds = list(_BOUNDS)
        self.bounds[3] = (float(data.x.min()), float(data.x.max()))
        self.has_slope = ns > 1
        if ns > 1:
            self.bounds.append((0.0, 2.0))  # κ
        if kind == "rounded":  # ω, the bend's width in log wait, last
            self.bounds.append((float(min_bend), 3.0))
        # Plain Gauss–Hermite nodes, shared; `adapt_nodes` centres them per person.
        self.person_nodes = PersonNodes.plain(self)
        # The dense pass's (cycles × nodes) work arrays, allocated at its first evaluation
        # (the active-only hinge never needs them).
        self._buf: list[np.ndarray] = []
        self.n_evals = 0

    def adapt_nodes(self, theta: np.ndarray, rounds: int = 1) -> None:
        """Centre and scale each person's nodes on their posterior at θ (adaptive
        Gauss–Hermite quadrature; ``rounds`` repeats it from the nodes it gives, since the
        posterior read off coarse nodes is coarse). Only the active-only hinge has person
        nodes; the two-group hinge keeps its two thresholds."""
        if self.kind != "hinge" or self.dense:
            raise ValueError("adaptive nodes are implemented for the hinge only")
        for _ in range(rounds):
            self.person_nodes = adapted(self, *posterior_moments(self, theta))

    @property
    def n_params(self) -> int:
        """5, or 6 with the random slope above the breakpoint (κ); "rounded" adds ω last."""
        return len(self.bounds)

    def _hinge_basis(self, c: float, tau: float, omega: float = 0.0
                     ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(h, ∂h/∂arg, ∂h/∂ω): the rise's basis at every cycle and z node, its slope in the
        breakpoint's argument (None where c and τ do not enter) and, for the rounded onset,
        in ω."""
        x = self.d.x
        if self.kind == "hinge":
            arg = x[:, None] - c - tau * self.z[None, :]  # (N, nz)
            return np.maximum(arg, 0.0), arg > 0, None
        if self.kind == "rounded":  # ω·softplus(arg/ω): the hinge with its corner rounded
            u = (x[:, None] - c - tau * self.z[None, :]) / omega
            sp, sig = np.logaddexp(0.0, u), expit(u)
            return omega * sp, sig, sp - u * sig
        if self.kind == "slopes":  # c is the pivot where intercept and slope are uncorrelated
            return (x - c)[:, None], None, None
        if self.kind == "smooth":
            return (x - self.xc)[:, None], None, None
        return np.zeros((x.size, 1)), None, None

    def nll(self, theta: np.ndarray, need_grad: bool = True) -> tuple[float, np.ndarray]:
        """(−ℓ, −∂ℓ/∂θ) at θ = (a, σ_u, b, c, τ[, κ])."""
        self.n_evals += 1
        if self.kind == "hinge" and not self.dense:
            return hinge_nll(self, theta, need_grad)
        a, su, b, c, tau = (float(t) for t in theta[:5])
        kappa = float(theta[5]) if self.has_slope else 0.0
        omega = float(theta[-1]) if self.kind == "rounded" else 0.0
        h, active, dh_domega = self._hinge_basis(c, tau, omega)
        es = np.exp(kappa * self.s)  # people's slope factors at the s nodes
        lin = (h * (b + tau * self.z)[None, :] if self.kind == "slopes" else b * h)
        n, nz = lin.shape
        ns, nv = self.s.size, self.v.size
        if not self._buf:
            self._buf = [np.empty((n, self.log_w.size), dtype=self.dtype) for _ in range(2)]
        eta, ll = self._buf
        rise = (lin[:, :, None] * es[None, None, :]).reshape(n, nz * ns)
        eta3 = eta.reshape(n, nv, nz * ns)
        for k, base in enumerate(a + su * self.v):
            np.add(rise, base, out=eta3[:, k, :])
        # log P(observed y) into ll, the score ∂log P/∂η over η (`switch_loglik`).
        ll, score = log_p(eta, self.sign, self.no_switch, self.detection, out=ll)
        per = row_sums(ll, self.d.starts, self.ends) + self.log_w
        tot = logsumexp(per, axis=1)
        f = -float(tot.sum())
        if not need_grad:
            return f, np.zeros(self.n_params)
        post = np.exp(per - tot[:, None]).astype(self.dtype)  # posterior node weights
        weight_rows(score, post, self.d.starts, self.ends)  # no gather per row
        rzs = score.reshape(n, nv, nz * ns).sum(axis=1, dtype=np.float64).reshape(n, nz, ns)
        rz = rzs.sum(axis=2)  # (N, nz)
        r1 = rzs @ es  # (N, nz): weighted by the slope factor
        g = np.zeros(self.n_params)
        g[0] = rz.sum()
        g[1] = float(score.sum(axis=0, dtype=np.float64).reshape(nv, -1).sum(axis=1) @ self.v)
        g[2] = float((r1 * h).sum())
        if self.kind == "slopes":
            g[4] = float((rz * h).sum(axis=0) @ self.z)
            g[3] = -float(rz.sum(axis=0) @ (b + tau * self.z))
        if active is not None:
            rin = r1 * active
            g[3] = -b * float(rin.sum())
            g[4] = -b * float(rin.sum(axis=0) @ self.z)
        if self.has_slope:
            g[5] = b * float(((rzs @ (self.s * es)) * h).sum())
        if dh_domega is not None:  # the rounded onset's ω: softplus(u) − u·σ(u)
            g[-1] = b * float((r1 * dh_domega).sum())
        return f, -g


@dataclass
class Fit:
    theta: np.ndarray
    loglik: float
    converged: bool
    n_evals: int


class LikelihoodModel(Protocol):
    """What `maximize` needs of a model: its kind, bounds and (−ℓ, −∇ℓ)."""

    kind: str
    bounds: list[tuple[float | None, float | None]]
    n_evals: int

    def nll(self, theta: np.ndarray, need_grad: bool = True) -> tuple[float, np.ndarray]: ...


def maximize(model: LikelihoodModel, start: np.ndarray,
             fixed: dict[int, float] | None = None,
             bounds: list[tuple[float | None, float | None]] | None = None,
             ftol: float = FTOL) -> Fit:
    """L-BFGS-B on the free parameters (those not in ``fixed``) from ``start``; it stops when
    an iteration improves −ℓ by less than ``ftol`` of its value (or the projected gradient
    is below 1e-4)."""
    fixed = fixed or {}
    bounds = bounds or model.bounds
    n_par = len(bounds)
    theta = np.asarray(start, float).copy()
    if theta.size < n_par:  # a 5-parameter start for the random-slope hinge: κ from 0.3
        theta = np.r_[theta, np.full(n_par - theta.size, 0.3)]
    theta = theta[:n_par]
    for k, val in fixed.items():
        theta[k] = val
    free = [k for k in range(n_par) if k not in fixed]
    if model.kind not in ("hinge", "slopes", "hazard", "spline", "rounded", "scurve"):
        # c and τ do not enter; b is absent from the flat model
        free = [k for k in free if k not in (3, 4) and not (model.kind == "flat" and k == 2)]
    elif model.kind == "hazard":  # no breakpoint
        free = [k for k in free if k != 3]
    sds = getattr(model, "sd_params", (1, 4, 5))
    for k in sds:
        # At σ_u = 0, τ = 0 or κ = 0 the gradient in them is exactly 0 (symmetric nodes): a start
        # there would never leave the boundary even when the maximum lies inside.
        if k in free:
            theta[k] = max(theta[k], 0.05)
    evals0 = model.n_evals

    def fun(tf: np.ndarray) -> tuple[float, np.ndarray]:
        t = theta.copy()
        t[free] = tf
        f, g = model.nll(t)
        return f, g[free]

    def run(t0: np.ndarray) -> tuple[np.ndarray, float, bool]:
        res = minimize(fun, t0, jac=True, method="L-BFGS-B",
                       bounds=[bounds[k] for k in free],
                       options={"maxiter": 500, "ftol": ftol, "gtol": 1e-4})
        return res.x, -float(res.fun), bool(res.success)

    x, ll, ok = run(theta[free])
    for j, k in enumerate(free):
        # A line search can overshoot onto σ_u = 0 or τ = 0 and stay there (zero gradient):
        # restart from inside and keep the better maximum.
        if k in sds and x[j] < 1e-6:
            t0 = x.copy()
            t0[j] = 0.3
            x2, ll2, ok2 = run(t0)
            if ll2 > ll + 1e-9:
                x, ll, ok = x2, ll2, ok2
    theta[free] = x
    return Fit(theta=theta, loglik=ll, converged=ok, n_evals=model.n_evals - evals0)


def hessian(model: RandomBreakpointModel, theta: np.ndarray, free: list[int]) -> np.ndarray:
    """Observed information on the free parameters by central differences of the gradient."""
    k = len(free)
    out = np.zeros((k, k))
    for j, p in enumerate(free):
        step = 1e-4 * max(1.0, abs(theta[p]))
        tp, tm = theta.copy(), theta.copy()
        tp[p] += step
        tm[p] -= step
        out[:, j] = (model.nll(tp)[1][free] - model.nll(tm)[1][free]) / (2 * step)
    return 0.5 * (out + out.T)


def wald_se(model: RandomBreakpointModel, theta: np.ndarray) -> np.ndarray:
    """Wald standard errors of θ (NaN where the information is singular)."""
    free = list(range(theta.size))
    # A parameter at its lower bound 0 has no two-sided derivative; nudge it inside.
    t = theta.copy()
    for k in (1, 4, 5)[: theta.size - 3]:
        t[k] = max(t[k], 2e-3)
    info = hessian(model, t, free)
    try:
        cov = np.linalg.inv(info)
        se = np.sqrt(np.where(np.diag(cov) > 0, np.diag(cov), np.nan))
    except np.linalg.LinAlgError:
        se = np.full(theta.size, np.nan)
    return se


def profile_endpoint(model: RandomBreakpointModel, best: Fit, k: int, side: int, guess: float,
                     crit: float, lower_bound: float | None = None, max_steps: int = 8
                     ) -> tuple[float, int]:
    """One end of the profile-likelihood interval of parameter ``k``: the value where the
    signed root r = ±sqrt(2(ℓ̂ − ℓ_p)) reaches ±sqrt(crit). Secant steps on r (nearly linear
    in the parameter) from ``guess``; returns (endpoint, fits used). The endpoint is always an
    evaluated point: one within 0.02 of the target root, else the evaluated point nearest the
    estimate whose root reaches the target (conservative: the interval can only widen). When
    the profile never reaches the critical value inside the parameter's bounds (or
    ``lower_bound``), returns that bound."""
    target = math.sqrt(crit)
    est = float(best.theta[k])
    pts = [(est, 0.0)]
    start = best.theta.copy()
    val = guess
    fits = 0
    lo, hi = model.bounds[k]
    if lower_bound is not None:
        lo = lower_bound if lo is None else max(lo, lower_bound)
    edge = lo if side < 0 else hi
    for step in range(max_steps + 1):
        if edge is not None and (val - edge) * side >= 0:
            val = edge
        f = maximize(model, start, fixed={k: val}, ftol=FTOL_REFIT)
        fits += 1
        r = math.sqrt(max(0.0, 2 * (best.loglik - f.loglik)))
        if abs(r - target) < 0.02:
            return val, fits
        if val == edge and r < target:
            return val, fits
        pts.append((val, r))
        if step == max_steps:
            break
        start = f.theta
        (v0, r0), (v1, r1) = pts[-2], pts[-1]
        if r1 <= r0 + 1e-9:  # flat profile: step further out
            val = v1 + side * 2 * abs(v1 - est + 1e-3)
            continue
        val = v1 + (target - r1) * (v1 - v0) / (r1 - r0)
        # Never move by more than 3x the current distance from the estimate at once.
        span = abs(v1 - est) + 1e-3
        val = float(np.clip(val, v1 - 3 * span, v1 + 3 * span))
        if (val - est) * side <= 0:
            val = est + side * 0.5 * abs(v1 - est)
    beyond = [v for v, r in pts[1:] if r >= target]
    if beyond:
        return min(beyond, key=lambda v: abs(v - est)), fits
    return (edge if edge is not None else max(pts, key=lambda p: p[1])[0]), fits
