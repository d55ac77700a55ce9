"""Flow threshold: known truths (hinge / flat / smooth), numerics against statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from flowtrial.analysis import AnalysisInputError
from flowtrial.analysis.pooled_fit import newton
from flowtrial.analysis.threshold import fit_threshold
from flowtrial.analysis.threshold_truth import population_onset_psi, simulate_switch_data

FAST = {"n_boot": 60, "n_null": 60}


@pytest.fixture(scope="module")
def hinge_fit():
    df = simulate_switch_data("hinge", 60, 120, psi_sd=0.0, seed=11)
    return fit_threshold(df, seed=3, **FAST)


def test_hinge_truth_recovers_psi_within_ci(hinge_fit) -> None:  # noqa: ANN001
    r = hinge_fit
    assert r.found and r.reason is None and r.model_choice == "hinge"
    assert r.ci_s[0] <= 8.0 <= r.ci_s[1]
    assert r.ci_s[0] <= r.psi_s <= r.ci_s[1]
    assert 5.0 < r.psi_s < 12.0
    assert r.p_exists <= 1 / 61 + 1e-12  # LR beats every null replicate
    assert r.bic["hinge"] < r.bic["smooth"] < r.bic["flat"]
    assert r.params["hinge"]["b"] > 0


def test_curve_for_plotting(hinge_fit) -> None:  # noqa: ANN001
    r = hinge_fit
    w = np.geomspace(0.3, 50, 40)
    c = r.curve(w)
    for key in ("hinge", "smooth", "flat", "hinge_lo", "hinge_hi", "smooth_lo", "smooth_hi"):
        assert c[key].shape == w.shape
    below = w < r.psi_s
    assert np.allclose(c["hinge"][below], c["hinge"][below][0])  # flat below ψ
    assert np.all(np.diff(c["hinge"][~below]) > 0)  # rising above ψ
    assert np.all(c["hinge_lo"] <= c["hinge_hi"])
    assert c["hinge"][-1] > 0.4 and c["hinge"][0] < 0.08  # p_high / p_low of the truth
    d = r.to_dict()
    assert d["psi_s"] == r.psi_s and len(d["grid_s"]) == len(d["profile_loglik"]) == 60
    assert "boot_hinge" not in d


def test_profile_maximum_is_the_estimate(hinge_fit) -> None:  # noqa: ANN001
    r = hinge_fit
    j = int(np.argmax(r.profile_loglik))
    step = math.log(r.grid_s[1] / r.grid_s[0])
    assert abs(math.log(r.psi_s / r.grid_s[j])) <= step + 1e-9
    assert r.loglik["hinge"] >= max(r.profile_loglik) - 1e-9


def test_flat_truth_reports_no_threshold() -> None:
    df = simulate_switch_data("flat", 40, 100, seed=5)
    r = fit_threshold(df, seed=1, **FAST)
    assert not r.found
    assert r.p_exists >= 0.05
    assert r.model_choice == "flat"
    assert r.reason.startswith("No threshold")


def test_smooth_truth_is_not_called_a_hinge() -> None:
    df = simulate_switch_data("smooth", 40, 100, seed=6)
    r = fit_threshold(df, seed=1, **FAST)
    assert r.p_exists < 0.05  # switching does depend on the wait ...
    assert r.model_choice == "smooth" and not r.found  # ... but without a threshold
    assert "smooth" in r.reason


def test_seeded_and_reproducible() -> None:
    df = simulate_switch_data("hinge", 20, 80, seed=2)
    a = fit_threshold(df, seed=9, n_boot=20, n_null=20)
    b = fit_threshold(df, seed=9, n_boot=20, n_null=20)
    assert a.to_dict() == b.to_dict()
    assert np.array_equal(a.boot_hinge, b.boot_hinge)


def test_newton_matches_statsmodels_logit() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 4, 500)
    psis = np.array([0.5, 1.5, 2.5])
    H = np.maximum(0.0, x[:, None] - psis[None, :])
    y = (rng.random(500) < 1 / (1 + np.exp(-(-2 + 1.2 * H[:, 1])))).astype(float)
    n = np.ones_like(y)
    a, b, ll = newton(H, H * H, y @ H, n, y, np.zeros(3), np.zeros(3))
    for g in range(3):
        ref = sm.Logit(y, sm.add_constant(H[:, g])).fit(disp=0)
        assert a[g] == pytest.approx(ref.params[0], abs=1e-6)
        assert b[g] == pytest.approx(ref.params[1], abs=1e-6)
        assert ll[g] == pytest.approx(ref.llf, abs=1e-8)


def test_binned_fit_agrees_with_exact_fit() -> None:
    df = simulate_switch_data("hinge", 20, 60, psi_sd=0.0, seed=4)
    exact = fit_threshold(df, seed=0, n_boot=10, n_null=10, max_bins=10_000)
    binned = fit_threshold(df, seed=0, n_boot=10, n_null=10)
    assert exact.exact and not binned.exact
    step = math.log(exact.grid_s[1] / exact.grid_s[0])
    assert abs(math.log(exact.psi_s / binned.psi_s)) < step
    assert binned.loglik["hinge"] == pytest.approx(exact.loglik["hinge"], abs=2.0)


def test_switched_may_be_bool_and_rows_with_missing_values_are_dropped() -> None:
    df = simulate_switch_data("hinge", 10, 50, seed=1)
    df["switched"] = df["switched"].astype(bool)
    df.loc[0, "wait_s"] = np.nan
    r = fit_threshold(df, n_boot=10, n_null=10)
    assert r.dropped == 1 and r.n_obs == 499 and r.n_participants == 10


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.drop(columns=["switched"]), "lacks column"),
        (lambda d: d.assign(wait_s=0.0), "> 0"),
        (lambda d: d.assign(switched=2), "0/1"),
        (lambda d: d.assign(participant_id=1), ">= 2 participants"),
        (lambda d: d.assign(switched=0), "never"),
        (lambda d: d.head(10), "too few cycles"),
        (lambda d: d.assign(wait_s=3.0), "hardly vary"),
    ],
)
def test_bad_input(mutate, fragment) -> None:  # noqa: ANN001
    df = mutate(simulate_switch_data("hinge", 5, 40, seed=0))
    with pytest.raises(AnalysisInputError) as err:
        fit_threshold(df, n_boot=10, n_null=10)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_simulator_shapes_and_truths() -> None:
    df = simulate_switch_data("hinge", 50, 400, seed=0)
    assert list(df.columns) == ["participant_id", "wait_s", "switched", "true_psi_s"]
    assert len(df) == 20_000 and df["wait_s"].between(0.2, 60).all()
    low = df[df["wait_s"] < 2]["switched"].mean()
    high = df[df["wait_s"] > 45]["switched"].mean()
    assert low == pytest.approx(0.03, abs=0.015) and high > 0.45
    assert pd.Series(
        np.log(df.groupby("participant_id")["true_psi_s"].first())
    ).std() == pytest.approx(0.35, abs=0.1)
    with pytest.raises(AnalysisInputError):
        simulate_switch_data("step", 2, 2)  # type: ignore[arg-type]


def test_population_onset_psi() -> None:
    # Without person-to-person variation the pooled limit is the threshold itself ...
    assert population_onset_psi(8.0, 0.0) == pytest.approx(8.0, rel=0.01)
    # ... with it, the population-averaged curve starts rising earlier.
    star = population_onset_psi(8.0, 0.35)
    assert 6.0 < star < 7.6
    assert population_onset_psi(8.0, 0.6) < star


def test_pseudo_true_psi_is_the_pooled_estimand() -> None:
    """Without heterogeneity ψ* is ψ; with varying personal thresholds it lies below the
    median, where the pooled fit on a large sample lands too."""
    from flowtrial.analysis.threshold_truth import pseudo_true_psi
    from flowtrial.study.simulator.params import SimParams, expected_switch_probability

    rng = np.random.default_rng(3)
    w = np.exp(rng.uniform(np.log(0.2), np.log(60), 20000))
    same = SimParams(truth="hinge", threshold_logsd=0.0)
    assert pseudo_true_psi(w, expected_switch_probability(w, same)) == pytest.approx(8.0, rel=0.01)
    varied = SimParams(truth="hinge")
    star = pseudo_true_psi(w, expected_switch_probability(w, varied))
    assert 5.5 < star < 7.5
    # A big pooled sample from the same truth: the estimate sits near ψ*, not near 8 s.
    psi_i = varied.threshold_s * np.exp(varied.threshold_logsd * rng.standard_normal(200))
    pid = np.repeat(np.arange(200), 100)
    waits = np.exp(rng.uniform(np.log(0.2), np.log(60), pid.size))
    from flowtrial.study.simulator.params import switch_probability

    y = rng.random(pid.size) < switch_probability(waits, psi_i[pid], varied)
    df = pd.DataFrame({"participant_id": pid, "wait_s": waits, "switched": y})
    res = fit_threshold(df, n_boot=10, n_null=10, seed=1)
    assert abs(math.log(res.psi_s / star)) < abs(math.log(res.psi_s / 8.0))
