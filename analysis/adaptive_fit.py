"""Fits under adaptive Gauss–Hermite quadrature (the random-breakpoint hinge).

With many cycles per person a person's posterior over (z, v, s) is narrow, and the plain
product grid (`rb_model.gh_nodes`, the same nodes for everyone) misses it: at 100 × 200 with
people's slopes differing (`hinge_strong`, seeds 1000–1002), the plain 16 × 5 × 5 grid's
optima lay 5–11 units of log-likelihood below the adaptive ones (both evaluated accurately),
fits from different starts ended up to 18 units and ψ̂ 5.7–8.0 s apart, and κ̂ came out low
(0.45–0.68, truth 0.8). Adaptive quadrature centres and scales each person's nodes on their
posterior (`hinge_kernel.adapted`): with 12 × 5 × 5 adaptive nodes fits from three starts
ended within 1.1 units of each other, ψ̂ 5.4–6.3 s, κ̂ 0.79–0.89
(`benchmarks/bench_quadrature.py`).

`personal_threshold` fits every hinge it compares by a likelihood ratio this way by default
(``quadrature="adaptive"``; "plain" keeps the shared grid).
"""

from __future__ import annotations

import numpy as np

from .hinge_kernel import adapted, posterior_moments
from .rb_model import FTOL_REFIT, Fit, RandomBreakpointModel, maximize


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
    less than ``tol`` (at most ``max_rounds`` fits; each to `rb_model.FTOL_REFIT`, well
    inside ``tol``). The log-likelihood is the last fit's, at its own nodes."""
    evals = model.n_evals
    start_adaptation(model, start)
    fit = maximize(model, start, fixed, ftol=FTOL_REFIT)
    for _ in range(max_rounds - 1):
        model.adapt_nodes(fit.theta, rounds=2)
        ll_now = -model.nll(fit.theta, need_grad=False)[0]
        new = maximize(model, fit.theta, fixed, ftol=FTOL_REFIT)
        done = abs(new.loglik - ll_now) < tol and abs(ll_now - fit.loglik) < tol
        fit = new
        if done:
            break
    fit.n_evals = model.n_evals - evals
    return fit
