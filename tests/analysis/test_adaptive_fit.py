"""Adaptive Gauss–Hermite quadrature of the hinge (`hinge_kernel.adapted`,
`adaptive_fit`): with many cycles per person it matches brute-force integration where the
plain grid of the same size misses, its gradient is the likelihood's, and fits from different
starts agree."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import approx_fprime

from flowtrial.analysis.adaptive_fit import maximize_adaptive, start_adaptation
from flowtrial.analysis.rb_model import CycleData, RandomBreakpointModel
from flowtrial.analysis.threshold_truth import simulate_switch_data


def _data(df: pd.DataFrame) -> CycleData:
    return CycleData.from_arrays(np.log(df["wait_s"].to_numpy()), df["switched"].to_numpy(),
                                 df["participant_id"].to_numpy())


def _brute_force(df: pd.DataFrame, theta: np.ndarray, n_grid: int, slope: bool) -> float:
    """The marginal log-likelihood by a midpoint rule over (v, z[, s]) on [-6, 6]."""
    a, su, b, c, tau = theta[:5]
    kappa = theta[5] if slope else 0.0
    grid = np.linspace(-6, 6, n_grid)
    w = np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi) * (grid[1] - grid[0])
    s_grid, s_w = (grid, w) if slope else (np.zeros(1), np.ones(1))
    total = 0.0
    for _, g in df.groupby("participant_id"):
        x, y = np.log(g["wait_s"].to_numpy()), g["switched"].to_numpy()
        lik = np.zeros((grid.size, grid.size))  # (v, z), summed over s
        for s_val, s_wt in zip(s_grid, s_w, strict=True):
            hinge = np.maximum(0, x[:, None] - c - tau * grid[None, :])  # (n, z)
            eta = (a + su * grid[None, :, None]
                   + b * math.exp(kappa * s_val) * hinge[:, None, :])  # (n, v, z)
            logp = np.where(y[:, None, None] == 1, -np.logaddexp(0, -eta),
                            -np.logaddexp(0, eta)).sum(axis=0)
            lik += s_wt * np.exp(logp)
        total += math.log(float(w @ lik @ w))
    return total


@pytest.mark.parametrize("slope", [False, True])
def test_adaptive_nodes_match_brute_force_where_plain_misses(slope: bool) -> None:
    df = simulate_switch_data("hinge_slopes", 3, 250, psi_s=6.0, intercept_sd=0.8, seed=4)
    theta = np.array([-2.5, 0.8, 1.6, math.log(6.0), 0.6, 0.7])[:6 if slope else 5]
    nodes = (12, 5, 5) if slope else (12, 5)
    exact = _brute_force(df, theta, 81 if slope else 241, slope)
    model = RandomBreakpointModel(_data(df), nodes)
    plain = -model.nll(theta, need_grad=False)[0]
    start_adaptation(model, theta, rounds=4)
    adaptive = -model.nll(theta, need_grad=False)[0]
    assert abs(adaptive - exact) < 0.02
    assert abs(plain - exact) > 10 * abs(adaptive - exact)


def test_gradient_at_adapted_nodes_matches_finite_differences() -> None:
    df = simulate_switch_data("hinge_slopes", 6, 120, psi_s=6.0, intercept_sd=0.5, seed=9)
    model = RandomBreakpointModel(_data(df), (8, 3, 3), detection=0.8)
    theta = np.array([-2.5, 0.4, 1.3, math.log(5.0), 0.3, 0.6])
    start_adaptation(model, theta)
    _, grad = model.nll(theta)
    num = approx_fprime(theta, lambda t: model.nll(t, need_grad=False)[0], 1e-6)
    assert np.allclose(grad, num, rtol=1e-4, atol=1e-3)


def test_adaptation_keeps_the_two_group_thresholds() -> None:
    df = simulate_switch_data("hinge", 5, 60, psi_s=6.0, seed=2)
    model = RandomBreakpointModel(_data(df), (12, 5), kind="hinge_two_groups")
    model.adapt_nodes(np.array([-2.0, 0.5, 1.2, math.log(6.0), 0.4]))
    assert np.array_equal(model.person_nodes.z, np.tile([-1.0, 1.0], (5, 1)))
    with pytest.raises(ValueError):
        RandomBreakpointModel(_data(df), (12, 5), kind="rounded").adapt_nodes(np.zeros(6))


def test_fits_from_different_starts_agree() -> None:
    """Slopes differ strongly (κ = 0.8), 150 cycles per person: the adaptive fits from a
    small and a large slope spread end at the same optimum."""
    df = simulate_switch_data("hinge_slopes", 20, 150, psi_s=6.0, slope_sd=0.8, seed=11)
    model = RandomBreakpointModel(_data(df), (12, 5, 5))
    base = np.array([-3.0, 0.3, 1.5, math.log(8.0), 0.6])
    fits = [maximize_adaptive(model, np.r_[base[:4], base[4] * f, k])
            for f, k in ((1.0, 0.3), (0.25, 1.2))]
    assert abs(fits[0].loglik - fits[1].loglik) < 0.2
    assert math.exp(fits[0].theta[3]) == pytest.approx(math.exp(fits[1].theta[3]), rel=0.05)


def test_personal_fit_under_adaptive_quadrature() -> None:
    """The whole personal fit with adaptive nodes: every LR-compared fit made the same way,
    its intervals added later from the same nodes, the check at finer adaptive nodes."""
    from flowtrial.analysis import AnalysisInputError
    from flowtrial.analysis.personal_threshold import (
        ADAPTIVE_CHECK_NODES,
        add_intervals,
        fit_personal_threshold,
    )

    df = simulate_switch_data("hinge", 12, 120, psi_s=6.0, intercept_sd=0.5, seed=21)
    res = fit_personal_threshold(df, quadrature="adaptive", workers=1, intervals=False)
    assert res.quadrature == "adaptive" and res.ci_s is None
    assert res.node_check is not None and res.node_check["nodes"] == list(ADAPTIVE_CHECK_NODES)
    assert abs(res.node_check["rel_change_median_psi"]) < 0.05
    add_intervals(df, res, workers=1)
    assert res.ci_s is not None and res.ci_s[0] < res.median_psi_s < res.ci_s[1]
    assert 3.0 < res.median_psi_s < 12.0
    # The τ = 0 fit shares the quadrature, so the LR is not a difference of grid errors.
    assert res.loglik["hinge"] >= res.loglik["hinge_tau0"] - 0.05
    with pytest.raises(AnalysisInputError, match="quadrature"):
        fit_personal_threshold(df, quadrature="laplace", workers=1)
