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
    p1 = np.multiply(eta, sign)
    np.clip(p1, -80.0, 80.0, out=p1)
    expit(p1, out=p1)
    if d < 1.0:
        m = p1 * d
        m += no_switch * (1.0 - d)
        score = np.subtract(1.0, p1)
        score *= p1
        score *= d
        score /= m
    else:
        m, score = p1, np.subtract(1.0, p1)
    score *= sign
    return np.log(m), score


@dataclass
class _Block:
    """The active cycles of one threshold node, by person: the persons with such cycles, where
    their rows begin, and the per-person sums of ∂log P/∂η and of h·∂log P/∂η at (v, s)."""

    people: np.ndarray
    score: np.ndarray  # (people, n_v, n_s)
    score_h: np.ndarray


def hinge_nll(model: RandomBreakpointModel, theta: np.ndarray, need_grad: bool = True
              ) -> tuple[float, np.ndarray]:
    """(−ℓ, −∂ℓ/∂θ) of the hinge at θ = (a, σ_u, b, c, τ[, κ]); the same as the dense pass.
    Node layout (v, z, s), as the dense pass's."""
    a, su, b, c, tau = (float(t) for t in theta[:5])
    kappa = float(theta[5]) if model.has_slope else 0.0
    z, s, v, d = model.z, model.s, model.v, model.detection
    x, y1 = model.d.x, model.y1
    n_people, nz, ns, nv = model.d.n_participants, z.size, s.size, v.size
    es = np.exp(kappa * s)
    eta0 = a + su * v
    ll1, dl1 = _log_p(eta0, 1.0, 0.0, d)  # a switch below the breakpoint, per v node
    ll0, dl0 = _log_p(eta0, -1.0, 1.0, d)  # no switch below it
    per = np.empty((n_people, nv, nz, ns))
    blocks: list[_Block] = []
    below: list[np.ndarray] = []  # per person and v node: the score of the cycles below
    for j in range(nz):
        active = x > c + tau * z[j]
        n1 = np.add.reduceat(y1 & ~active, model.d.starts).astype(float)[:, None]
        n0 = np.add.reduceat(~y1 & ~active, model.d.starts).astype(float)[:, None]
        per[:, :, j, :] = (n1 * ll1 + n0 * ll0)[:, :, None]
        below.append(n1 * dl1 + n0 * dl0)
        rows = np.flatnonzero(active)
        if not rows.size:
            blocks.append(_Block(rows, np.zeros((0, nv, ns)), np.zeros((0, nv, ns))))
            continue
        h = x[rows] - c - tau * z[j]
        eta = eta0[None, :, None] + (b * h)[:, None, None] * es[None, None, :]
        ll, score = _log_p(eta, model.sign[rows][:, :, None], model.no_switch[rows][:, :, None],
                           d)
        pid = model.person_of_row[rows]
        firsts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
        people = pid[firsts]
        per[people, :, j, :] += np.add.reduceat(ll, firsts, axis=0)
        if need_grad:
            score_h = np.add.reduceat(score * h[:, None, None], firsts, axis=0)
            blocks.append(_Block(people, np.add.reduceat(score, firsts, axis=0), score_h))
    flat = per.reshape(n_people, -1) + model.log_w
    tot = logsumexp(flat, axis=1)
    f = -float(tot.sum())
    if not need_grad:
        return f, np.zeros(model.n_params)
    post = np.exp(flat - tot[:, None]).reshape(n_people, nv, nz, ns)
    g = np.zeros(model.n_params)
    for j, blk in enumerate(blocks):
        # Below the breakpoint: the counts' scores, weighted by the posterior summed over s.
        r_in = post[:, :, j, :].sum(axis=2) * below[j]  # (P, nv)
        # Above it: the per-person score sums, weighted by the person's posterior.
        w = post[blk.people, :, j, :]
        r0 = (blk.score * w).sum(axis=0)  # (nv, ns)
        rh = (blk.score_h * w).sum(axis=0).sum(axis=0)  # (ns,)
        r0_s = r0.sum(axis=0)
        g[0] += r_in.sum() + r0.sum()
        g[1] += float(r_in.sum(axis=0) @ v) + float(r0.sum(axis=1) @ v)
        g[2] += float(rh @ es)
        g[3] -= b * float(r0_s @ es)
        g[4] -= b * float(r0_s @ es) * z[j]
        if model.has_slope:
            g[5] += b * float(rh @ (s * es))
    return f, -g
