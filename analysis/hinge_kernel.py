"""The hinge's marginal log-likelihood, computed only where the hinge is active.

Below a person's breakpoint the hinge is flat: there η = a + σ_u·v depends on neither the
wait nor the slope node, so every cycle below the breakpoint of threshold node z contributes
the same log-probability per (v) node, and one count of switches and one of non-switches per
person stand for all of them. Only the cycles above the breakpoint (about 40 % of them in the
benchmark's studies) need the full (cycle × slope node × v node) pass. The result is the
dense pass's (`RandomBreakpointModel` with ``kind`` "rounded" or "slopes" still uses that)
to rounding error (tested), at a fraction of its cost (`benchmarks/bench_threshold_time.py`).

The nodes are per person (`PersonNodes`): on the plain grid everyone shares them; adaptive
quadrature (`adapted`, from `posterior_moments`; used by `adaptive_fit`) centres and scales
each person's on their posterior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import logsumexp

from .switch_loglik import log_p, row_sums

if TYPE_CHECKING:
    from .rb_model import RandomBreakpointModel


@dataclass
class PersonNodes:
    """Each person's quadrature nodes for (z, v, s) and their log weights (P, n_v·n_z·n_s),
    layout (v, z, s). Plain Gauss–Hermite gives every person the same nodes; adaptive
    quadrature (`adapted`) centres and scales them on the person's posterior."""

    z: np.ndarray  # (P, n_z)
    v: np.ndarray  # (P, n_v)
    s: np.ndarray  # (P, n_s)
    log_w: np.ndarray  # (P, Q) or (1, Q)

    @classmethod
    def plain(cls, model: RandomBreakpointModel) -> PersonNodes:
        return cls(model.z[None, :], model.v[None, :], model.s[None, :], model.log_w[None, :])


@dataclass
class _Block:
    """The active cycles of one threshold node, by person: the persons with such cycles and
    the per-person sums of ∂log P/∂η and of h·∂log P/∂η at (v, s)."""

    people: np.ndarray
    score: np.ndarray  # (people, n_v, n_s)
    score_h: np.ndarray


def _rows(a: np.ndarray, people: np.ndarray) -> np.ndarray:
    """Rows of a per-person array for ``people`` (a shared row when all persons share it)."""
    return a[people] if a.shape[0] > 1 else np.broadcast_to(a, (people.size, a.shape[1]))


def _per_node(model: RandomBreakpointModel, theta: np.ndarray, need_grad: bool
              ) -> tuple[np.ndarray, list[_Block], list[np.ndarray]]:
    """Each person's log-likelihood at each node plus its log weight, (P, Q); and, for the
    gradient, the blocks of active cycles and the scores of the cycles below each z node."""
    a, su, b, c, tau = (float(t) for t in theta[:5])
    kappa = float(theta[5]) if model.has_slope else 0.0
    nodes, d = model.person_nodes, model.detection
    x, y1, starts = model.d.x, model.y1, model.d.starts
    n_people = model.d.n_participants
    nz, ns, nv = nodes.z.shape[1], nodes.s.shape[1], nodes.v.shape[1]
    es = np.exp(kappa * nodes.s)  # (P or 1, ns)
    eta0 = a + su * nodes.v  # (P or 1, nv)
    # The active cycles' work arrays in the model's dtype (sums over cycles stay float64).
    es_w: np.ndarray = es.astype(model.dtype)
    eta0_w: np.ndarray = eta0.astype(model.dtype)
    ll1, dl1 = log_p(eta0, 1.0, 0.0, d)  # a switch below the breakpoint, per v node
    ll0, dl0 = log_p(eta0, -1.0, 1.0, d)  # no switch below it
    per = np.empty((n_people, nv, nz, ns))
    blocks: list[_Block] = []
    below: list[np.ndarray] = []  # per person and v node: the score of the cycles below
    row_z = nodes.z[model.person_of_row] if nodes.z.shape[0] > 1 else nodes.z
    empty = np.zeros((0, nv, ns))
    for j in range(nz):
        thr = c + tau * row_z[:, j]
        active = x > thr
        n1 = np.add.reduceat(y1 & ~active, starts).astype(float)[:, None]
        n0 = np.add.reduceat(~y1 & ~active, starts).astype(float)[:, None]
        per[:, :, j, :] = (n1 * ll1 + n0 * ll0)[:, :, None]
        below.append(n1 * dl1 + n0 * dl0)
        rows = np.flatnonzero(active)
        if not rows.size:
            blocks.append(_Block(rows, empty, empty))
            continue
        h: np.ndarray = (x[rows] - (thr[rows] if thr.size > 1 else thr)).astype(model.dtype)
        pid = model.person_of_row[rows]
        eta = (_rows(eta0_w, pid)[:, :, None]
               + (b * h)[:, None, None] * _rows(es_w, pid)[:, None, :])
        ll, score = log_p(eta, model.sign[rows][:, :, None], model.no_switch[rows][:, :, None],
                          d, out=np.empty_like(eta))
        firsts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
        lasts = np.r_[firsts[1:], rows.size]
        people = pid[firsts]
        per[people, :, j, :] += row_sums(ll, firsts, lasts)
        if need_grad:
            score_h = row_sums(score * h[:, None, None], firsts, lasts)
            blocks.append(_Block(people, row_sums(score, firsts, lasts), score_h))
    return per.reshape(n_people, -1) + nodes.log_w, blocks, below


def hinge_nll(model: RandomBreakpointModel, theta: np.ndarray, need_grad: bool = True
              ) -> tuple[float, np.ndarray]:
    """(−ℓ, −∂ℓ/∂θ) of the hinge at θ = (a, σ_u, b, c, τ[, κ]) at the model's person nodes;
    with plain nodes the same as the dense pass."""
    flat, blocks, below = _per_node(model, theta, need_grad)
    tot = logsumexp(flat, axis=1)
    f = -float(tot.sum())
    if not need_grad:
        return f, np.zeros(model.n_params)
    b = float(theta[2])
    kappa = float(theta[5]) if model.has_slope else 0.0
    nodes = model.person_nodes
    n_people, nv, nz, ns = flat.shape[0], nodes.v.shape[1], nodes.z.shape[1], nodes.s.shape[1]
    post = np.exp(flat - tot[:, None]).reshape(n_people, nv, nz, ns)
    everyone = np.arange(n_people)
    v_all = _rows(nodes.v, everyone)
    g = np.zeros(model.n_params)
    for j, blk in enumerate(blocks):
        # Below the breakpoint: the counts' scores, weighted by the posterior summed over s.
        r_in = post[:, :, j, :].sum(axis=2) * below[j]  # (P, nv)
        g[0] += r_in.sum()
        g[1] += float((r_in * v_all).sum())
        if not blk.people.size:
            continue
        # Above it: the per-person score sums, weighted by the person's posterior.
        w = post[blk.people, :, j, :]
        s_p = _rows(nodes.s, blk.people)
        es = np.exp(kappa * s_p)[:, None, :]  # (people, 1, ns)
        r0 = blk.score * w  # (people, nv, ns)
        rh = blk.score_h * w
        r0_es = (r0 * es).sum(axis=(1, 2))  # (people,)
        g[0] += r0.sum()
        g[1] += float((r0.sum(axis=2) * _rows(nodes.v, blk.people)).sum())
        g[2] += float((rh * es).sum())
        g[3] -= b * float(r0_es.sum())
        g[4] -= b * float(r0_es @ _rows(nodes.z, blk.people)[:, j])
        if model.has_slope:
            g[5] += b * float((rh * es * s_p[:, None, :]).sum())
    return f, -g


def posterior_moments(model: RandomBreakpointModel, theta: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Each person's posterior mean and sd of (z, v, s) at θ, (P, 3) each, from the model's
    current nodes."""
    flat, _, _ = _per_node(model, theta, need_grad=False)
    nodes = model.person_nodes
    n_people, nv, nz, ns = flat.shape[0], nodes.v.shape[1], nodes.z.shape[1], nodes.s.shape[1]
    post = np.exp(flat - logsumexp(flat, axis=1)[:, None]).reshape(n_people, nv, nz, ns)
    everyone = np.arange(n_people)
    marg = (post.sum(axis=(1, 3)), post.sum(axis=(2, 3)), post.sum(axis=(1, 2)))
    vals = (_rows(nodes.z, everyone), _rows(nodes.v, everyone), _rows(nodes.s, everyone))
    mean = np.stack([(m * x).sum(axis=1) for m, x in zip(marg, vals, strict=True)], axis=1)
    var = np.stack([(m * (x - mu[:, None]) ** 2).sum(axis=1)
                    for m, x, mu in zip(marg, vals, mean.T, strict=True)], axis=1)
    return mean, np.sqrt(np.maximum(var, 0.0))


def adapted(model: RandomBreakpointModel, mean: np.ndarray, sd: np.ndarray) -> PersonNodes:
    """Nodes centred on each person's posterior ``mean`` and scaled by its ``sd`` (adaptive
    Gauss–Hermite: ∫f(u)φ(u)du = Σ_k w_k·σ·f(μ + σt_k)·φ(μ + σt_k)/φ(t_k)). A dimension with
    one node (absent from the model) keeps its node at 0, and the two-group hinge its two
    thresholds ±1."""
    base = (model.z, model.v, model.s)
    out, extra = [], []
    for k, t in enumerate(base):
        if t.size == 1 or (k == 0 and model.two_groups):
            # absent (one node at 0) or the two groups' thresholds ±1: kept as they are
            out.append(np.broadcast_to(t, (mean.shape[0], t.size)).copy())
            extra.append(np.zeros((mean.shape[0], t.size)))
            continue
        sd_k = np.clip(sd[:, k], 1e-3, 2.0)[:, None]
        u = mean[:, k][:, None] + sd_k * t[None, :]
        out.append(u)
        extra.append(np.log(sd_k) + 0.5 * (t[None, :] ** 2 - u ** 2))
    ez, ev, es = extra
    log_w = (model.log_w.reshape(ev.shape[1], ez.shape[1], es.shape[1])[None]
             + ev[:, :, None, None] + ez[:, None, :, None] + es[:, None, None, :])
    return PersonNodes(out[0], out[1], out[2], log_w.reshape(mean.shape[0], -1))
