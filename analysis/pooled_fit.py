"""The pooled hinge logistic's numerics (`threshold.fit_threshold`): vectorised
Newton–Raphson fits of logit p = a + b·h(log w) for every candidate ψ at once, on binomial
sufficient statistics (cycles aggregated by participant × log-wait bin). The threshold module
holds the estimator around them (grid, existence test, bootstrap, intervals, verdict)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def expit(eta: np.ndarray) -> np.ndarray:
    """The logistic function, overflow-free."""
    return 0.5 * (1.0 + np.tanh(0.5 * eta))


def p_and_ll(
    a: np.ndarray, b: np.ndarray, H: np.ndarray, sH: np.ndarray, n: np.ndarray, s_tot: float
) -> tuple[np.ndarray, np.ndarray]:
    """Fitted probabilities and binomial log-likelihood per column, from one pass over η.

    ℓ = Σ s·η − n·log(1 + e^η) = s_tot·a + b·(s @ H) − n @ softplus(η)."""
    eta = a + b * H
    e = np.exp(-np.abs(eta))  # in (0, 1]: no overflow
    p = np.where(eta >= 0, 1.0, e) / (1.0 + e)
    softplus = np.maximum(eta, 0.0) + np.log1p(e)
    return p, s_tot * a + b * sH - n @ softplus


def newton(
    H: np.ndarray,
    H2: np.ndarray,
    sH: np.ndarray,
    n: np.ndarray,
    s: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    max_iter: int = 60,
    tol: float = 1e-9,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit logit p = a_g + b_g·H[:, g] for every column g at once (binomial, n trials, s
    successes per row). H2 = H**2 and sH = s @ H are precomputed. Returns (a, b, loglik).

    Newton–Raphson on the 2×2 system per column with step clipping and per-column step
    halving (the log-likelihood is concave, so halving always restores ascent)."""
    a = a.astype(float).copy()
    b = b.astype(float).copy()
    s_tot = float(s.sum())
    p, ll = p_and_ll(a, b, H, sH, n, s_tot)
    for _ in range(max_iter):
        v = p * (1.0 - p)
        g0 = s_tot - n @ p
        g1 = sH - n @ (p * H)
        h00 = n @ v
        vH = v * H
        h01 = n @ vH
        h11 = n @ (vH * H) if H2 is None else n @ (v * H2)
        det = h00 * h11 - h01 * h01
        ok = det > 1e-12 * np.maximum(h00 * h11, 1e-300)
        safe = np.where(ok, det, 1.0)
        # Columns with a (near-)singular Hessian (e.g. complete separation): intercept step.
        da = np.where(ok, (h11 * g0 - h01 * g1) / safe, np.clip(g0 / np.maximum(h00, 1e-9), -1, 1))
        db = np.where(ok, (h00 * g1 - h01 * g0) / safe, 0.0)
        da = np.clip(da, -5.0, 5.0)
        db = np.clip(db, -5.0, 5.0)
        step = np.ones_like(a)
        a_new, b_new = a + da, b + db
        p_new, ll_new = p_and_ll(a_new, b_new, H, sH, n, s_tot)
        for _halving in range(30):
            worse = ll_new < ll - 1e-12 * (1.0 + np.abs(ll))
            if not worse.any():
                break
            idx = np.flatnonzero(worse)
            step[idx] *= 0.5
            a_new[idx] = a[idx] + step[idx] * da[idx]
            b_new[idx] = b[idx] + step[idx] * db[idx]
            p_new[:, idx], ll_new[idx] = p_and_ll(
                a_new[idx], b_new[idx], H[:, idx], sH[idx], n, s_tot
            )
        gain = float(np.max(np.abs(ll_new - ll)))
        moved = float(np.max(np.abs(step * da)) + np.max(np.abs(step * db)))
        a, b, p, ll = a_new, b_new, p_new, ll_new
        # Quadratic convergence: after a step this small the remaining error is ~1e-10.
        if gain < tol * (1.0 + float(np.max(np.abs(ll)))) or moved < 1e-5:
            break
    return a, b, ll


def binom_ll_flat(n_tot: float, s_tot: float) -> tuple[float, float]:
    """(intercept, log-likelihood) of the flat (intercept-only) model, closed form."""
    if s_tot <= 0 or s_tot >= n_tot:
        return (-math.inf if s_tot <= 0 else math.inf), 0.0
    p = s_tot / n_tot
    return math.log(p / (1 - p)), s_tot * math.log(p) + (n_tot - s_tot) * math.log1p(-p)


@dataclass
class Binned:
    """Cycles aggregated by participant × log-wait bin."""

    x: np.ndarray  # (K,) representative log wait
    counts: np.ndarray  # (P, K) cycles per participant × bin
    succ: np.ndarray  # (P, K) switches per participant × bin
    exact: bool


def bin_cycles(logw: np.ndarray, y: np.ndarray, pid: np.ndarray, n_part: int,
               max_bins: int) -> Binned:
    """Switch counts per participant × distinct log wait (exact, up to `max_bins` values) or
    × equal-width log-wait bin represented by its cycles' mean log wait."""
    uniq, inv = np.unique(logw, return_inverse=True)
    exact = uniq.size <= max_bins
    if exact:
        x, idx = uniq, inv
    else:
        edges = np.linspace(logw.min(), logw.max(), max_bins + 1)
        idx = np.clip(np.searchsorted(edges, logw, side="right") - 1, 0, max_bins - 1)
        _, idx = np.unique(idx, return_inverse=True)  # only the bins in use
        x = np.bincount(idx, weights=logw) / np.bincount(idx)
    k = x.size
    flat = pid * k + idx
    counts = np.bincount(flat, minlength=n_part * k).reshape(n_part, k).astype(float)
    succ = np.bincount(flat, weights=y, minlength=n_part * k).reshape(n_part, k)
    return Binned(x=x, counts=counts, succ=succ, exact=exact)


class PooledProblem:
    """Everything needed to refit the three models on re-weighted / redrawn data."""

    def __init__(self, binned: Binned, grid: np.ndarray) -> None:
        self.x = binned.x
        self.grid = grid
        self.H = np.maximum(0.0, self.x[:, None] - grid[None, :])  # hinge basis, one column/ψ
        self.H2 = self.H * self.H
        self.xc = self.x.mean()
        self.S = (self.x - self.xc)[:, None]  # smooth basis (centred for conditioning)
        self.S2 = self.S * self.S

    def hinge_at(
        self, n: np.ndarray, s: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hinge fits (a, b, loglik) at the given log ψ values `c` (one column each)."""
        h = np.maximum(0.0, self.x[:, None] - np.asarray(c, dtype=float)[None, :])
        return newton(h, h * h, s @ h, n, s, a, b)

    def fit(
        self, n: np.ndarray, s: np.ndarray, start: dict[str, np.ndarray] | None = None
    ) -> dict[str, Any]:
        """Fit flat, smooth and hinge (profile over the grid + parabolic refinement)."""
        n_tot, s_tot = float(n.sum()), float(s.sum())
        a0, ll_flat = binom_ll_flat(n_tot, s_tot)
        if not math.isfinite(a0):
            # No switches (or only switches): every model fits perfectly and identically.
            g = self.grid.size
            return {
                "ll_flat": 0.0,
                "flat_a": a0,
                "ll_smooth": 0.0,
                "ll_hinge": 0.0,
                "smooth": (a0, 0.0),
                "hinge": (a0, 0.0, float(self.grid[g // 2])),
                "profile": np.zeros(g),
                "degenerate": True,
            }
        g = self.grid.size
        if start is None:
            ah, bh = np.full(g, a0), np.zeros(g)
            as_, bs = np.array([a0]), np.zeros(1)
        else:
            ah, bh, as_, bs = start["ah"], start["bh"], start["as"], start["bs"]
        sS = s @ self.S
        as_, bs, lls = newton(self.S, self.S2, sS, n, s, as_, bs)
        sH = s @ self.H
        ah, bh, prof = newton(self.H, self.H2, sH, n, s, ah, bh)
        j = int(np.argmax(prof))
        best = (float(ah[j]), float(bh[j]), float(self.grid[j]), float(prof[j]))
        if 0 < j < g - 1:
            # Parabola through the best grid point and its neighbours (grid is equispaced).
            l0, l1, l2 = prof[j - 1], prof[j], prof[j + 1]
            curv = l0 - 2 * l1 + l2
            if curv < 0:
                step = self.grid[1] - self.grid[0]
                c = self.grid[j] + float(np.clip(0.5 * step * (l0 - l2) / curv, -step, step))
                h = np.maximum(0.0, self.x - c)[:, None]
                ar, br, llr = newton(h, h * h, s @ h, n, s, ah[j : j + 1], bh[j : j + 1])
                if llr[0] > best[3]:
                    best = (float(ar[0]), float(br[0]), c, float(llr[0]))
        return {
            "ll_flat": ll_flat,
            "flat_a": a0,
            "ll_smooth": float(lls[0]),
            "ll_hinge": best[3],
            "smooth": (float(as_[0]), float(bs[0])),
            "hinge": best[:3],
            "profile": prof,
            "start": {"ah": ah, "bh": bh, "as": as_, "bs": bs},
            "degenerate": False,
        }
