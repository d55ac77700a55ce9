"""Personal flow threshold (random-breakpoint hinge): numerics against brute force, known
truths recovered, the τ = 0 test, the detection share."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import approx_fprime
from scipy.special import expit

from flowtrial.analysis import AnalysisInputError
from flowtrial.analysis.personal_threshold import (
    SLOPE_ALPHA,
    estimate_detection_share,
    fit_personal_threshold,
    pooled_start,
)
from flowtrial.analysis.rb_model import (
    CycleData,
    RandomBreakpointModel,
    maximize,
    profile_endpoint,
)
from flowtrial.analysis.threshold_truth import simulate_switch_data


def _data(df: pd.DataFrame) -> CycleData:
    return CycleData.from_arrays(np.log(df["wait_s"].to_numpy()), df["switched"].to_numpy(),
                                 df["participant_id"].to_numpy())


@pytest.mark.parametrize("nodes", [(12, 5), (12, 5, 5)])
@pytest.mark.parametrize("detection", [1.0, 0.7])
def test_gradient_matches_finite_differences(detection: float, nodes: tuple[int, ...]
                                             ) -> None:
    """With three node counts the hinge has a random slope (θ gains κ): its gradient too."""
    df = simulate_switch_data("hinge_slopes", 8, 40, psi_s=6.0, intercept_sd=0.5, seed=3)
    model = RandomBreakpointModel(_data(df), nodes, detection=detection)
    theta = np.array([-2.5, 0.4, 1.3, math.log(5.0), 0.3, 0.6])[:model.n_params]
    _, grad = model.nll(theta)
    num = approx_fprime(theta, lambda t: model.nll(t, need_grad=False)[0], 1e-6)
    assert np.allclose(grad, num, rtol=1e-4, atol=1e-3)


def test_likelihood_matches_brute_force_integration() -> None:
    """GH quadrature against a dense midpoint rule over (z, v), written out independently."""
    df = simulate_switch_data("hinge", 4, 25, psi_s=6.0, seed=8)
    a, su, b, c, tau, d = -2.0, 0.5, 1.4, math.log(6.0), 0.4, 0.8
    model = RandomBreakpointModel(_data(df), (24, 7), detection=d)
    f, _ = model.nll(np.array([a, su, b, c, tau]))
    grid = np.linspace(-6, 6, 481)
    w = np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi) * (grid[1] - grid[0])
    ll = 0.0
    for _, g in df.groupby("participant_id"):
        x, y = np.log(g["wait_s"].to_numpy()), g["switched"].to_numpy()
        eta = (a + su * grid[None, :, None]
               + b * np.maximum(0, x[:, None, None] - c - tau * grid[None, None, :]))
        p = d * expit(eta)
        lik = np.prod(np.where(y[:, None, None] == 1, p, 1 - p), axis=0)  # (v, z)
        ll += math.log(float(w @ lik @ w))
    assert -f == pytest.approx(ll, abs=2e-3)


def test_random_slope_likelihood_matches_brute_force_integration() -> None:
    """The three-effect likelihood (threshold z, intercept v, slope s) against a midpoint
    rule over a (v, z, s) grid. (The slope factor e^(κs) needs more s nodes than the fits
    use: 9 nodes are off by 0.006 here, 15 by 1e-4.)"""
    df = simulate_switch_data("hinge_slopes", 3, 20, psi_s=6.0, seed=8)
    a, su, b, c, tau, kappa = -2.0, 0.5, 1.4, math.log(6.0), 0.4, 0.7
    f, _ = RandomBreakpointModel(_data(df), (24, 7, 15)).nll(
        np.array([a, su, b, c, tau, kappa]))
    grid = np.linspace(-6, 6, 97)
    w = np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi) * (grid[1] - grid[0])
    ll = 0.0
    for _, g in df.groupby("participant_id"):
        x, y = np.log(g["wait_s"].to_numpy()), g["switched"].to_numpy()
        hinge = np.maximum(0, x[:, None, None, None] - c - tau * grid[None, None, :, None])
        eta = (a + su * grid[None, :, None, None]
               + b * np.exp(kappa * grid[None, None, None, :]) * hinge)
        p = expit(eta)
        lik = np.prod(np.where(y[:, None, None, None] == 1, p, 1 - p), axis=0)  # (v, z, s)
        ll += math.log(float(np.einsum("i,j,k,ijk->", w, w, w, lik)))
    assert -f == pytest.approx(ll, abs=2e-3)


def test_random_slope_removes_the_slope_bias() -> None:
    """People's slopes above ψ = 6 s differ strongly: without a random slope the median
    threshold is pushed up; with it (κ) it is found near 6 s and κ near the truth 0.8."""
    data = _data(simulate_switch_data("hinge_slopes", 30, 80, psi_s=6.0, intercept_sd=0.5,
                                      seed=1000))
    start = pooled_start(data)
    plain = maximize(RandomBreakpointModel(data, (12, 5)), start)
    rs = maximize(RandomBreakpointModel(data, (12, 5, 5)), np.r_[start, 0.8])
    assert math.exp(plain.theta[3]) > 9.0
    assert 4.5 < math.exp(rs.theta[3]) < 8.0 and 0.4 < rs.theta[5] < 1.2
    assert rs.loglik > plain.loglik + 5


def test_random_slope_is_kept_when_its_test_misses_mild_slope_differences() -> None:
    """Slopes differ mildly (log-sd 0.5) around a 15 s threshold: the 5 % test of κ = 0 does
    not reject in this study, yet the two-effect hinge would put the median near 20 s with a CI
    above the truth. The random slope is kept whenever κ̂ is off 0 (`SLOPE_ALPHA`)."""
    df = simulate_switch_data("hinge_slopes", 30, 80, psi_s=15.0, psi_sd=0.25, slope_sd=0.5,
                              p_low=0.06, seed=1023)
    r = fit_personal_threshold(df, workers=1, node_check=False)
    assert 0.05 < r.p_slope_sd_zero < SLOPE_ALPHA and len(r.nodes) == 3
    assert 0.1 < r.slope_sd < 0.6
    assert r.ci_s[0] < 15.0 < r.ci_s[1]


@pytest.fixture(scope="module")
def spread_fit():
    df = simulate_switch_data("hinge", 30, 70, psi_s=7.0, psi_sd=0.6, intercept_sd=0.4,
                              seed=21)
    return fit_personal_threshold(df, workers=1, node_check=False)


def test_recovers_median_threshold_and_spread(spread_fit) -> None:  # noqa: ANN001
    r = spread_fit
    assert r.ci_s[0] < 7.0 < r.ci_s[1] and r.ci_s[0] < r.median_psi_s < r.ci_s[1]
    assert abs(math.log(r.median_psi_s / 7.0)) < 0.3
    assert r.tau_ci[0] < 0.6 < r.tau_ci[1] and r.tau_ci[0] > 0
    assert r.p_tau_zero < 0.05  # the τ interval excludes 0 exactly when the τ = 0 test rejects
    # Profile-likelihood ends: the profile LR is the chi-square(1) 95 % point there.
    assert r.aic["hinge"] < r.aic["hinge_tau0"] and r.aic["hinge"] < r.aic["smooth"]
    lo, hi = r.psi_quantiles_s((0.1, 0.9))
    assert lo < r.median_psi_s < hi
    assert r.to_dict()["median_psi_s"] == r.median_psi_s


def test_no_spread_is_not_called_a_spread() -> None:
    df = simulate_switch_data("hinge", 25, 60, psi_s=4.5, psi_sd=0.0, seed=5)
    r = fit_personal_threshold(df, workers=1, node_check=False)
    assert r.p_tau_zero > 0.05
    assert r.tau_ci[0] == 0.0 and r.tau < 0.3  # consistent with the τ = 0 test
    assert r.ci_s[0] < 4.5 < r.ci_s[1]


def test_detection_share_corrects_for_uncounted_switches() -> None:
    df = simulate_switch_data("hinge", 30, 60, psi_s=7.0, psi_sd=0.3, seed=13)
    rng = np.random.default_rng(0)
    seen = df.assign(switched=df["switched"] * (rng.random(len(df)) < 0.6))
    known = fit_personal_threshold(seen, detection_share=0.6, workers=1, node_check=False)
    assert known.ci_s[0] < 7.0 < known.ci_s[1]
    # With d = 0.6 the fitted curve must reach higher: its intercept sits ~log(1/0.6) up.
    naive = fit_personal_threshold(seen, workers=1, node_check=False)
    assert known.intercept_a - naive.intercept_a > 0.3
    assert estimate_detection_share(pd.Series([1, 0, 1, 0]), pd.Series([1, 1, 1, 1])) == 0.5
    assert estimate_detection_share(pd.Series([0, 0]), pd.Series([0, 0])) == 1.0


def test_profile_endpoint_is_an_evaluated_point() -> None:
    """With too few secant steps to reach the target root, the endpoint is still a point
    whose profile was fitted and reaches the critical value (never an unevaluated guess)."""
    df = simulate_switch_data("hinge", 12, 50, psi_s=6.0, psi_sd=0.0, seed=4)
    model = RandomBreakpointModel(_data(df), (12, 5))
    best = maximize(model, pooled_start(model.d))
    crit = 3.841
    end, fits = profile_endpoint(model, best, 3, 1, float(best.theta[3]) + 0.01, crit,
                                 max_steps=1)
    assert fits == 2
    prof = maximize(model, best.theta, fixed={3: end})
    assert 2 * (best.loglik - prof.loglik) >= (math.sqrt(crit) - 0.021) ** 2 or \
        end == model.bounds[3][1]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.drop(columns=["switched"]), "lacks column"),
        (lambda d: d.assign(wait_s=-1.0), "> 0"),
        (lambda d: d.assign(switched=0), "with and without switches"),
        (lambda d: d.assign(participant_id=1), ">= 2 participants"),
    ],
)
def test_bad_input(mutate, fragment) -> None:  # noqa: ANN001
    df = mutate(simulate_switch_data("hinge", 5, 40, seed=0))
    with pytest.raises(AnalysisInputError) as err:
        fit_personal_threshold(df, workers=1)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(AnalysisInputError, match="detection share"):
        fit_personal_threshold(simulate_switch_data("hinge", 5, 40, seed=0), detection_share=0)
