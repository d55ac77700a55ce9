"""The hinge's marginal log-likelihood, computed only where the hinge is active.

Below a person's breakpoint the hinge is flat: there η = a + σ_u·v depends on neither the
wait nor the slope node, so every cycle below the breakpoint of threshold node z contributes
the same log-probability per (v) node, and one count of switches and one of non-switches per
person stand for all of them. Only the cycles above the breakpoint (about 40 % of them in the
benchmark's studies) need the full (cycle × slope node × v node) pass. The result is the
dense pass's (`RandomBreakpointModel` with ``kind`` "rounded" or "slopes" still uses that)
to rounding error (tested), at a fraction of its cost (`benchmarks/bench_threshold_time.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import expit, logsumexp

if TYPE_CHECKING:
    from .rb_model import RandomBreakpointModel


def _log_p(eta: np.ndarray, sign: np.ndarray | float, no_switch: np.ndarray | float,
           d: float) -> tuple[np.ndarray, np.ndarray]:
    """(log P(observed y), ∂log P/∂η) for linear predictors ``eta`` and outcome signs ±1 with
    detection share ``d``: P = d·expit(η) for a counted switch, 1 − d·expit(η) otherwise."""
    p1 = expit(np.clip(eta * sign, -80.0, 80.0))
    if d < 1.0:
        m = p1 * d + no_switch * (1.0 - d)
        return np.log(m), (1.0 - p1) * p1 * d / m * sign
    return np.log(p1), (1.0 - p1) * sign


@dataclass
class _Block:
    """The active cycles of one threshold node: their rows and hinge values, and ∂log P/∂η
    at (row, s node, v node)."""

    rows: np.ndarray
    h: np.ndarray
    score: np.ndarray


def hinge_nll(model: RandomBreakpointModel, theta: np.ndarray, need_grad: bool = True
              ) -> tuple[float, np.ndarray]:
    """(−ℓ, −∂ℓ/∂θ) of the hinge at θ = (a, σ_u, b, c, τ[, κ]); the same as the dense pass."""
    a, su, b, c, tau = (float(t) for t in theta[:5])
    kappa = float(theta[5]) if model.has_slope else 0.0
    z, s, v, d = model.z, model.s, model.v, model.detection
    x, y1 = model.d.x, model.y1
    n_people, nz, ns, nv = model.d.n_participants, z.size, s.size, v.size
    es = np.exp(kappa * s)
    eta0 = a + su * v
    ll1, dl1 = _log_p(eta0, 1.0, 0.0, d)  # a switch below the breakpoint, per v node
    ll0, dl0 = _log_p(eta0, -1.0, 1.0, d)  # no switch below it
    per = np.empty((n_people, nz, ns, nv))
    blocks: list[_Block] = []
    below1: list[np.ndarray] = []
    below0: list[np.ndarray] = []
    for j in range(nz):
        active = x > c + tau * z[j]
        n1 = np.add.reduceat(y1 & ~active, model.d.starts).astype(float)
        n0 = np.add.reduceat(~y1 & ~active, model.d.starts).astype(float)
        per[:, j] = (n1[:, None] * ll1 + n0[:, None] * ll0)[:, None, :]
        below1.append(n1)
        below0.append(n0)
        rows = np.flatnonzero(active)
        h = x[rows] - c - tau * z[j]
        eta = (a + su * v)[None, None, :] + (b * h)[:, None, None] * es[None, :, None]
        ll, score = _log_p(eta, model.sign[rows][:, :, None], model.no_switch[rows][:, :, None],
                           d)
        pid = model.person_of_row[rows]
        if rows.size:
            firsts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
            per[pid[firsts], j] += np.add.reduceat(ll, firsts, axis=0)
        blocks.append(_Block(rows, h, score))
    flat = per.reshape(n_people, -1) + model.log_w
    tot = logsumexp(flat, axis=1)
    f = -float(tot.sum())
    if not need_grad:
        return f, np.zeros(model.n_params)
    post = np.exp(flat - tot[:, None]).reshape(n_people, nz, ns, nv)
    g = np.zeros(model.n_params)
    for j, blk in enumerate(blocks):
        # Below the breakpoint: the counts' scores, weighted by the posterior summed over s.
        w = post[:, j].sum(axis=1)  # (P, nv)
        r_in = w * (below1[j][:, None] * dl1 + below0[j][:, None] * dl0)
        g[0] += r_in.sum()
        g[1] += float(r_in.sum(axis=0) @ v)
        if not blk.rows.size:
            continue
        pid = model.person_of_row[blk.rows]
        r = blk.score * post[pid, j]  # (rows, s, v): posterior-weighted score
        rs = r.sum(axis=2)  # (rows, s)
        r1 = rs @ es  # weighted by the slope factor
        g[0] += rs.sum()
        g[1] += float(r.sum(axis=(0, 1)) @ v)
        g[2] += float(r1 @ blk.h)
        g[3] -= b * float(r1.sum())
        g[4] -= b * float(r1.sum()) * z[j]
        if model.has_slope:
            g[5] += b * float((rs @ (s * es)) @ blk.h)
    return f, -g
