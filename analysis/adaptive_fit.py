"""Fits under adaptive Gauss–Hermite quadrature (the random-breakpoint hinge).

With 100+ cycles per person a person's posterior over (z, v, s) is narrow, and the plain
product grid (`rb_model.gh_nodes`, the same nodes for everyone) misses it: at 100 × 200 with
people's slopes differing, the plain 16 × 5 × 5 grid put the log-likelihood 10–30 units
below its value, ranked optima wrongly (fits from different starts ended 12 units and
ψ̂ 6.1–8.0 s apart) and pulled κ̂ down (0.61–0.68, truth 0.8). Adaptive quadrature centres and
scales each person's nodes on their posterior (`hinge_kernel.adapted`): 12 × 5 × 5 adaptive
nodes came within 0.4 of the converged log-likelihood, and fits from three starts ended
within 0.7 units, κ̂ 0.85–0.90 (`benchmarks/bench_quadrature.py`).

Not yet used by `personal_threshold` (see docs/concepts/analysis.md): every fit compared there
by a likelihood ratio must then be made the same way.
"""

from __future__ import annotations

import numpy as np

from .hinge_kernel import adapted, posterior_moments
from .rb_model import Fit, RandomBreakpointModel, maximize


def start_adaptation(model: RandomBreakpointModel, theta: np.ndarray, rounds: int = 2) -> None:
    """Centre the model's nodes on each person's posterior at θ: the posterior read off a
    plain grid 3x finer (the model's own plain nodes can miss a sharp posterior between
    them), then refined ``rounds`` times on the adapted nodes themselves."""
    counts = (model.z.size, model.v.size, model.s.size)
    fine = RandomBreakpointModel(model.d, tuple(3 * k + 1 if k > 1 else 1 for k in counts),
                                 detection=model.detection)
    theta = np.asarray(theta, float)[:model.n_params]
    mean, sd = posterior_moments(fine, theta)
    model.person_nodes = adapted(model, mean, sd)
    model.adapt_nodes(theta, rounds=rounds)


def maximize_adaptive(model: RandomBreakpointModel, start: np.ndarray,
                      fixed: dict[int, float] | None = None, *, tol: float = 0.01,
                      max_rounds: int = 8) -> Fit:
    """`maximize` under adaptive quadrature (`start_adaptation` at the start): the fit, the
    nodes re-centred at its optimum and the fit repeated until the log-likelihood moves by
    less than ``tol`` (at most ``max_rounds`` fits). The log-likelihood is the last fit's, at
    its own nodes."""
    evals = model.n_evals
    start_adaptation(model, start)
    fit = maximize(model, start, fixed)
    for _ in range(max_rounds - 1):
        model.adapt_nodes(fit.theta, rounds=2)
        ll_now = -model.nll(fit.theta, need_grad=False)[0]
        new = maximize(model, fit.theta, fixed)
        done = abs(new.loglik - ll_now) < tol and abs(ll_now - fit.loglik) < tol
        fit = new
        if done:
            break
    fit.n_evals = model.n_evals - evals
    return fit
