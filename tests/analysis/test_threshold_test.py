"""The test of a threshold against the no-threshold alternatives (issue 27): the
alternatives' likelihoods and gradients, their simulation, the parametric-bootstrap test and
the verdict rules (`threshold_verdict.personal_verdict`). Error rates are in
benchmarks/bench_threshold_quality.py --families."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import approx_fprime
from scipy.special import expit

from flowtrial.analysis.personal_threshold import add_intervals, fit_personal_threshold
from flowtrial.analysis.rb_model import CycleData, HazardModel, RandomBreakpointModel, maximize
from flowtrial.analysis.scurve_model import LOWER_BEND_UNITS, MIN_WIDTH, SCurveModel
from flowtrial.analysis.spline_model import SplineModel, ispline_basis
from flowtrial.analysis.threshold_test import (
    IN_SECONDS,
    LINEAR_SECONDS,
    MIN_BEND,
    ONSET_FACTOR,
    ONSETS_FROM_CYCLES,
    ROUNDED,
    SCREEN_AWAY,
    SCREEN_QUANTILES,
    SCURVE,
    SECONDS,
    SPLINE_SECONDS,
    alternative_starts,
    best_fit,
    describe_alternative,
    fit_hinge,
    hinge_starts,
    includes_onsets,
    make_model,
    screened_start,
    sequential_p,
    simulate_alternative,
    stop_count,
    threshold_test,
)
from flowtrial.analysis.threshold_truth import NO_THRESHOLD_TRUTHS, TRUTHS, simulate_switch_data
from flowtrial.analysis.threshold_verdict import fit_personal_and_test, personal_verdict


def _data(df) -> CycleData:  # noqa: ANN001
    return CycleData.from_arrays(np.log(df["wait_s"].to_numpy()), df["switched"].to_numpy(),
                                 df["participant_id"].to_numpy())


@pytest.mark.parametrize("detection", [1.0, 0.7])
@pytest.mark.parametrize("kind", ["slopes", "hazard", "spline", "linear", "scurve"])
def test_alternative_gradients_match_finite_differences(kind: str, detection: float) -> None:
    data = _data(simulate_switch_data("hazard", 8, 40, seed=3, intercept_sd=0.5))
    if kind == "hazard":
        model: RandomBreakpointModel | HazardModel | SplineModel | SCurveModel = HazardModel(
            data, (12, 5), detection=detection)
        theta = np.array([-3.0, 0.4, -4.0, 0.0, 0.5])
    elif kind == "spline":
        model = SplineModel(data, (12, 5), detection=detection)
        theta = np.array([-2.5, 0.4, 0.3, 1.0, 2.0])
    elif kind == "linear":
        model = SplineModel(data, (12, 5), detection=detection, linear=True)
        theta = np.array([-2.5, 0.4, 0.3, 2.0])
    elif kind == "scurve":
        model = SCurveModel(data, (12, 5), detection=detection)
        theta = np.array([-2.5, 0.4, 0.3, 2.0, 1.5, 0.9])
    else:
        model = RandomBreakpointModel(data, (12, 5), detection=detection, kind="slopes")
        theta = np.array([-2.0, 0.4, 0.8, 1.0, 0.3])
    _, grad = model.nll(theta)
    num = approx_fprime(theta, lambda t: model.nll(t, need_grad=False)[0], 1e-6)
    assert np.allclose(grad, num, rtol=1e-4, atol=1e-3)


def test_hazard_likelihood_matches_brute_force_integration() -> None:
    df = simulate_switch_data("hazard", 4, 25, seed=8, intercept_sd=0.5)
    a, su, b, tau, d = -3.0, 0.5, -4.0, 0.6, 0.8
    f, _ = HazardModel(_data(df), (24, 11), detection=d).nll(np.array([a, su, b, 0.0, tau]))
    grid = np.linspace(-6, 6, 481)
    w = np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi) * (grid[1] - grid[0])
    ll = 0.0
    for _, g in df.groupby("participant_id"):
        wait, y = g["wait_s"].to_numpy(), g["switched"].to_numpy()
        bg = expit(a + su * grid)[None, :, None]
        lam = np.exp(b + tau * grid)[None, None, :]
        p = d * (1 - (1 - bg) * np.exp(-lam * wait[:, None, None]))
        lik = np.prod(np.where(y[:, None, None] == 1, p, 1 - p), axis=0)  # (v, z)
        ll += math.log(float(w @ lik @ w))
    assert -f == pytest.approx(ll, abs=2e-3)


@pytest.mark.parametrize("kind", ["slopes", "seconds", "linear_seconds", "hazard", "spline",
                                  "spline_seconds", "scurve"])
def test_simulated_alternative_is_recovered(kind: str) -> None:
    """Data drawn from a fitted alternative give back its parameters (the bootstrap's null
    generator and the fit agree on what θ means)."""
    base = _data(simulate_switch_data("flat", 80, 60, seed=1))
    theta = {"hazard": np.array([-3.2, 0.5, -4.0, 0.0, 0.5]),
             "slopes": np.array([-1.5, 0.5, 0.9, 1.5, 0.4]),
             "spline": np.array([-3.0, 0.5, 0.3, 1.0, 2.0]),
             # in seconds over the geometric-mean wait (`in_seconds`): 0.06 to 17 here
             "seconds": np.array([-2.0, 0.5, 0.3, 1.0, 0.1]),
             "linear_seconds": np.array([-3.0, 0.5, 0.3, 2.5]),
             "spline_seconds": np.array([-3.0, 0.5, 0.3, 1.0, 2.0]),
             "scurve": np.array([-3.0, 0.5, 0.3, 3.0, 1.5, 0.9])}[kind]
    y = simulate_alternative(kind, theta, base, 1.0, np.random.default_rng(2))
    sim = CycleData(base.x, y, base.starts, base.n_participants)
    model = make_model(kind, sim, 1.0)
    fit = best_fit(model, alternative_starts(kind, sim))
    assert fit.theta[0] == pytest.approx(theta[0], abs=0.4)
    assert fit.theta[2] == pytest.approx(theta[2], abs=0.3)
    if kind in ("spline", "spline_seconds", "linear_seconds"):  # the whole rise is pinned
        assert fit.theta[3:].sum() == pytest.approx(theta[3:].sum(), rel=0.25)
    if kind == "scurve":  # the rise and its midpoint
        assert fit.theta[3] == pytest.approx(theta[3], rel=0.25)
        assert fit.theta[4] == pytest.approx(theta[4], abs=0.3)


def test_spline_alternative_is_monotone() -> None:
    """Every I-spline column rises from 0 to 1, so any δ ≥ 0 gives a non-decreasing curve;
    fitted to data that fall with the wait, the curve stays flat instead of falling."""
    x = np.linspace(-2.0, 4.5, 400)
    basis = ispline_basis(x, -1.6, 4.1)
    assert np.allclose(basis[x <= -1.6], 0.0) and np.allclose(basis[x >= 4.1], 1.0)
    assert (np.diff(basis, axis=0) >= -1e-12).all()
    rng = np.random.default_rng(0)
    for delta in rng.exponential(1.0, (20, 2)):
        assert (np.diff(basis @ delta) >= -1e-12).all()
    df = simulate_switch_data("flat", 20, 60, seed=4)
    falling = _data(df.assign(switched=(df["wait_s"] < 2.0).astype(int)))
    model = SplineModel(falling, (12, 5))
    fit = maximize(model, alternative_starts("spline", falling)[0])
    curve = model.curve(fit.theta, x)
    assert (np.diff(curve) >= -1e-9).all() and curve[-1] - curve[0] < 0.05


def test_truth_families_are_known() -> None:
    assert NO_THRESHOLD_TRUTHS < set(TRUTHS)
    df = simulate_switch_data("hinge", 40, 30, unbalanced=True, seed=3)
    counts = df.groupby("participant_id").size()
    assert counts.max() > 2 * counts.min()
    assert abs(counts.mean() - 30) < 5
    bimodal = simulate_switch_data("bimodal", 10, 5, psi_s=6.0, seed=1)
    assert sorted(bimodal["true_psi_s"].round(3).unique()) == pytest.approx(
        [6 / math.sqrt(6), 6 * math.sqrt(6)], rel=1e-3)


@pytest.mark.parametrize("truth", ["sigmoid_midpoints", "gompertz"])
def test_skeptics_s_curves_move_each_persons_midpoint(truth: str) -> None:
    """The skeptics' S-shaped truths (no threshold) rise around each person's own ψᵢ: people
    with a short ψᵢ switch far more often at middling waits than people with a long one —
    unlike the sigmoid, whose people differ in the size of one shared rise."""
    assert truth in NO_THRESHOLD_TRUTHS

    def gap(name: str) -> float:
        d = simulate_switch_data(name, 200, 300, psi_s=6.0, psi_sd=0.8, seed=1)
        mid, short = d["wait_s"].between(2, 12), d["true_psi_s"] < 6.0
        return float(d[mid & short]["switched"].mean() - d[mid & ~short]["switched"].mean())

    assert gap(truth) > 0.1 and abs(gap("sigmoid")) < 0.05


def test_memoryless_switching_loses_to_the_hazard_and_a_threshold_wins() -> None:
    """Constant-hazard data: the hazard fits better than the logistic, a smooth alternative
    wins (the monotone spline can also follow a constant hazard's curve) and the hinge gains
    little; threshold data (everyone's ψ = 8 s): the hinge beats every null replicate."""
    hazard = _data(simulate_switch_data("hazard", 20, 50, seed=5, intercept_sd=0.5))
    res = threshold_test(hazard, 1.0, None, n_boot=3, seed=1, workers=1)
    assert res.best in ("hazard", "spline") and res.stat < 2.0
    assert res.loglik["hazard"] > res.loglik["slopes"] and 1 <= len(res.null_stats) <= 3
    assert res.p_value > 0.25  # it stopped at the first replicate that reached T (or drew 3)
    assert "each extra second" in describe_alternative("hazard", np.array(
        res.params["hazard"]), hazard)
    hinge = _data(simulate_switch_data("hinge", 30, 80, psi_sd=0.0, seed=1))
    won = threshold_test(hinge, 1.0, None, n_boot=3, seed=1, workers=1)
    assert won.stat > max(won.null_stats) + 3 and won.p_value == pytest.approx(0.25)
    again = threshold_test(hinge, 1.0, None, n_boot=3, seed=1, workers=1)
    assert again.null_stats == won.null_stats  # seeded


def test_a_rise_linear_in_seconds_is_not_a_threshold() -> None:
    """Logistic in the wait in seconds, people's intercepts and slopes differing: on a
    log-wait axis flat, then ever steeper, so the hinge beats every log-wait alternative by
    far (an outside generator's studies of this kind were called thresholds in 8-16 of 20 at
    30 × 80); the steady rises in seconds, alternatives at every size, explain it better."""
    df = simulate_switch_data("logistic_seconds", 30, 80, seed=1)
    res = threshold_test(_data(df), 1.0, None, n_boot=3, seed=1, workers=1)
    ll = res.loglik
    assert SPLINE_SECONDS not in ll  # 2,400 cycles: not the gradual onsets
    assert min(ll["hinge"] - ll[k] for k in ("slopes", "hazard", "spline")) > 10
    assert res.best in (SECONDS, LINEAR_SECONDS) and res.stat < 0 and res.p_value > 0.25
    assert "odds of switching grow" in res.summary and "in seconds" in res.summary


def test_describe_alternative_in_words() -> None:
    data = _data(simulate_switch_data("flat", 3, 10, seed=1))
    gm = math.exp(float(data.x.mean()))  # the seconds alternative's unit of wait
    per_s = describe_alternative("seconds", np.array([-2.0, 0.3, 0.1 * gm, 1.0, 0.1]), data)
    assert "11 % with every extra second" in per_s  # e^0.1 − 1
    per_10 = describe_alternative("seconds", np.array([-2.0, 0.3, 0.01 * gm, 1.0, 0.1]), data)
    assert "11 % with every extra 10 seconds" in per_10
    span = float(np.ptp(np.exp(data.x)))  # the straight rise's δ spans the waits' range
    linear = describe_alternative(LINEAR_SECONDS, np.array([-2.0, 0.3, 0.2, 0.1 * span]), data)
    assert "11 % with every extra second" in linear
    text = describe_alternative("slopes", np.array([-2.0, 0.3, 1.0, 0.0, 0.2]), data)
    assert "100 % with every doubling" in text
    flat = describe_alternative("spline", np.array([-2.0, 0.3, 0.2, 0.0, 0.0]), data)
    assert "without a breakpoint" in flat and flat.count("12 %") == 2  # expit(−2) = 11.9 %


PERSONAL = {"ci_s": [4.0, 8.0], "slope_b": 1.5,
            "node_check": {"nodes": [48, 11], "rel_change_median_psi": 0.01}}
POOLED = {"p_exists": 0.004}
WAITS = np.array([0.2, 60.0])
TEST = {"p_value": 0.05, "summary": "switching rises steadily with the wait: …",
        "label": "background + constant hazard", "n_boot": 19}


def test_verdict_rules() -> None:
    assert personal_verdict(PERSONAL, POOLED, WAITS, test=TEST) == (True, None)
    found, reason = personal_verdict(PERSONAL, POOLED, WAITS, test={**TEST, "p_value": 0.1})
    assert not found and reason and "rises steadily" in reason and "constant hazard" in reason
    assert not personal_verdict(PERSONAL, POOLED, WAITS)[0]  # no test run: no claim
    assert "depends on the wait" in str(personal_verdict(PERSONAL, {"p_exists": 0.2}, WAITS,
                                                         test=TEST)[1])
    moved = {**PERSONAL, "node_check": {"nodes": [48, 11], "rel_change_median_psi": -0.066}}
    found, reason = personal_verdict(moved, POOLED, WAITS, test=TEST)
    assert not found and "6.6 %" in str(reason)
    wide = {**PERSONAL, "ci_s": [1.0, 30.0]}
    assert "decade" in str(personal_verdict(wide, POOLED, WAITS, test=TEST)[1])
    edge = {**PERSONAL, "ci_s": [0.2, 1.5]}
    assert "edge" in str(personal_verdict(edge, POOLED, WAITS, test=TEST)[1])


def test_speed_table_shares_and_ranges() -> None:
    from flowtrial.analysis.threshold_speed import exceedance_table, share_exceeding

    tokens = np.array([100.0, 300.0, 900.0])
    # 50 tok/s, TTFT 0.5 s, reading 5: lags are 0 (100/50 < 100/5): no answer idles > 6 s.
    assert share_exceeding(6.0, tokens, 50.0, 0.5, 5.0) == 0.0
    # TTFT above ψ: every answer waits longer.
    assert share_exceeding(1.0, tokens, 3000.0, 2.0, 5.0) == 1.0
    # 2 tok/s against reading 5: lag = N·(1/2 − 1/5) = 0.3·N: 30, 90, 270 s > 6 s.
    assert share_exceeding(6.0, tokens, 2.0, 0.5, 5.0) == 1.0
    assert share_exceeding(40.0, tokens, 2.0, 0.5, 5.0) == pytest.approx(2 / 3)
    table = exceedance_table(6.0, [4.0, 9.0], tokens, found=True, reading_tps=5.0,
                             speeds=[2.0, 3.0], ttfts=[0.5])
    for row in table["rows"]:
        lo, hi = row["share_range"]
        assert lo <= row["share"] <= hi
    assert table["n_answers"] == 3 and table["reason"] is None
    turns = exceedance_table(6.0, [4.0, 9.0], tokens, found=True, wait_unit="turn")
    assert turns["rows"] is None and "agent turns" in turns["reason"]
    assert exceedance_table(6.0, [4.0, 9.0], [], found=True).get("reason") == (
        "no answer lengths recorded")
    # A threshold the verdict does not report (e.g. its CI spans more than a decade) is not
    # translated into model speeds, even with a CI.
    withdrawn = exceedance_table(6.0, [0.5, 90.0], tokens, found=False)
    assert withdrawn["rows"] is None and withdrawn["reason"] == "no threshold"
    # A CSV column with blanks or text: only the numeric lengths count.
    import pandas as pd

    mixed = pd.Series(["300", None, "n/a", 100.0])
    assert exceedance_table(6.0, [4.0, 9.0], mixed, found=True)["n_answers"] == 2


def test_shape_check_flags_two_groups_of_people() -> None:
    """Half the people at 2.4 s, half at 15 s: two groups fit better than log-normal
    thresholds, so percentiles are withheld; log-normal thresholds pass the check."""

    two = fit_personal_threshold(simulate_switch_data("bimodal", 30, 80, psi_s=6.0, seed=3),
                                 workers=1, node_check=False)
    assert not two.shape["lognormal_like"]
    lo, hi = two.shape["two_groups_psi_s"]
    assert lo < 6.0 / math.sqrt(6) * 1.6 and hi > 6.0 * math.sqrt(6) / 1.6
    one = fit_personal_threshold(simulate_switch_data("hinge", 30, 80, psi_s=6.0, seed=3),
                                 workers=1, node_check=False)
    assert one.shape["lognormal_like"]


def test_headline_of_a_no_threshold_study_names_the_steady_rise() -> None:
    from flowtrial.analysis.report_sections import threshold_headline

    _, reason = personal_verdict(PERSONAL, POOLED, WAITS, test={
        **TEST, "p_value": 0.65,
        "summary": "switching rises steadily with the wait: each extra second of waiting adds "
                   "about 1.5 % chance of switching (a constant hazard, the typical person)"})
    line = threshold_headline({"found": False, "reason": reason, "personal": {}},
                              "idle wait (definition)")
    assert line.startswith("No flow threshold reported: switching rises steadily with the "
                           "wait: each extra second of waiting adds about 1.5 %")
    assert "p = 0.65 > 0.05" in line and line.endswith(").")


def test_headline_when_the_monotone_curve_wins() -> None:
    """The spline alternative's finding, through the verdict, reads as one plain sentence."""
    from flowtrial.analysis.report_sections import threshold_headline

    data = _data(simulate_switch_data("flat", 10, 40, seed=2))
    theta = np.array([-3.0, 0.3, 0.2, 1.0, 1.5])
    test = {**TEST, "p_value": 0.4, "label": "monotone smooth curve in log wait",
            "summary": describe_alternative("spline", theta, data)}
    _, reason = personal_verdict(PERSONAL, POOLED, WAITS, test=test)
    line = threshold_headline({"found": False, "reason": reason, "personal": {}}, "idle wait")
    assert line.startswith("No flow threshold reported: switching rises steadily with the "
                           "wait, without a breakpoint: for the typical person from ")
    assert "monotone smooth curve" in line and "p = 0.4 > 0.05" in line


def test_a_random_slope_hinge_is_tested_with_its_random_slope() -> None:
    """When the main fit has κ (people's rises differ), the test's hinge has it too, in the
    data's fit and in every null replicate."""
    data = _data(simulate_switch_data("hinge_slopes", 10, 30, psi_s=6.0, seed=2))
    res = threshold_test(data, 1.0, np.array([-3.0, 0.3, 1.5, math.log(6.0), 0.3, 0.6]),
                         n_boot=1, seed=1, workers=1)
    assert res.nodes == [12, 5, 5] and len(res.params["hinge"]) == 6
    plain = threshold_test(data, 1.0, None, n_boot=1, seed=1, workers=1)
    assert plain.nodes == [12, 5] and len(plain.params["hinge"]) == 5
    assert res.loglik["hinge"] >= plain.loglik["hinge"] - 1e-6  # nested: never worse


def _four_arms(seed: int, n_part: int = 15, n_prompts: int = 40) -> CycleData:
    """Waits at four latency arms (1, 3, 9, 27 s, jittered), switching logistic in seconds."""
    rng = np.random.default_rng(seed)
    w = rng.choice([1.0, 3.0, 9.0, 27.0], (n_part, n_prompts)) * np.exp(
        rng.normal(0, 0.25, (n_part, n_prompts)))
    a = rng.normal(-2.8, 0.6, (n_part, 1))
    b = 0.06 * np.exp(rng.normal(0, 0.6, (n_part, 1)))
    y = rng.random((n_part, n_prompts)) < expit(a + b * w)
    return CycleData.from_arrays(np.log(w.ravel()), y.ravel().astype(float),
                                 np.repeat(np.arange(n_part), n_prompts))


def test_the_hinge_fit_screens_another_breakpoint() -> None:
    """With a few latency arms the hinge's likelihood has a mode per gap between them; from
    one start the optimiser stays in its own (here at 4 s, 2 log-likelihood units below the
    mode at 13 s). `fit_hinge` adds the screened start, for the data and every replicate
    alike, so replicates are not fitted worse than the data (which would make the test
    liberal)."""
    data = _four_arms(1)
    model = make_model("hinge", data, 1.0)
    theta = np.array([-3.0, 0.3, 1.0, math.log(2.0), 0.3])
    screened = screened_start(model, theta)
    assert screened is not None and abs(screened[3] - theta[3]) >= SCREEN_AWAY
    assert np.array_equal(np.delete(screened, 3), np.delete(theta, 3))
    grid = np.quantile(data.x, SCREEN_QUANTILES)
    far = grid[np.abs(grid - theta[3]) >= SCREEN_AWAY]
    nll = [model.nll(np.r_[theta[:3], c, theta[4:]], need_grad=False)[0] for c in far]
    assert screened[3] == pytest.approx(far[int(np.argmin(nll))])
    one = maximize(model, theta)
    both = fit_hinge(model, [theta])
    assert both.loglik > one.loglik + 1.0
    assert math.exp(one.theta[3]) < 6.0 < math.exp(both.theta[3])


def test_sequential_p_is_besag_clifford() -> None:
    """Stopped once h = stop_count replicates reach T among L drawn: p = max(h / L,
    (1 + h) / (B + 1)); all drawn: (1 + #) / (B + 1)."""
    assert (stop_count(19), stop_count(39), stop_count(29), stop_count(19, 0.1)) == (1, 2, 1, 2)
    assert sequential_p([1.0, 1.0, 5.0], 4.0, 19, 1) == pytest.approx(1 / 3)
    assert sequential_p([5.0, 1.0, 6.0], 4.0, 39, 2) == pytest.approx(2 / 3)
    assert sequential_p([1.0] * 19, 4.0, 19, 1) == pytest.approx(1 / 20)
    # α(B + 1) = 1.5: the first exceedance as the 29th replicate stops it, and p stays > α
    # (h / L alone would be 1/29 < 0.05, a rejection the full test does not make).
    assert sequential_p([1.0] * 28 + [4.0], 4.0, 29, 1) == pytest.approx(2 / 30)


@pytest.mark.parametrize(("n_max", "alpha"), [(19, 0.05), (29, 0.05), (39, 0.05), (99, 0.01),
                                              (19, 0.1)])
def test_the_sequential_verdict_is_the_full_tests(n_max: int, alpha: float) -> None:
    """Over many replicate sequences (the data's statistic ranked anywhere among them), the
    test that stops at `stop_count` rejects at α exactly when the test drawing all of them
    does."""
    rng = np.random.default_rng(n_max)
    stop = stop_count(n_max, alpha)
    for _ in range(400):
        null = list(rng.standard_normal(n_max))
        stat = float(rng.choice([*null, 2.5, 3.5, -3.0]))
        full = sequential_p(null, stat, n_max, n_max + 1)  # never stops
        hits = np.cumsum(np.asarray(null) >= stat - 1e-9)
        length = int(np.argmax(hits >= stop)) + 1 if hits[-1] >= stop else n_max
        p = sequential_p(null[:length], stat, n_max, stop)
        assert (p <= alpha) == (full <= alpha)


def test_a_clear_no_threshold_study_stops_early_with_the_full_tests_replicates() -> None:
    """Memoryless switching: the test stops once it cannot reject at 5 % (with 19 replicates:
    the first replicate that reaches T), and the replicates it drew are the full test's first
    ones (same seeds)."""
    hazard = _data(simulate_switch_data("hazard", 20, 50, seed=5, intercept_sd=0.5))
    res = threshold_test(hazard, 1.0, None, n_boot=19, seed=1, workers=2)
    # up to 19 for each alternative near the best; it stopped within the first
    assert res.n_max % 19 == 0 and 1 <= res.n_boot < 19 and list(res.components) == [res.best]
    hits = [t >= res.stat - 1e-9 for t in res.null_stats]
    assert sum(hits) == stop_count(19) == 1 and hits[-1]
    assert res.p_value == pytest.approx(max(1 / res.n_boot, 2 / 20)) and res.p_value > 0.05
    first = threshold_test(hazard, 1.0, None, n_boot=2, seed=1, workers=1)
    assert first.null_stats == pytest.approx(res.null_stats[:2])


@pytest.mark.parametrize("nodes", [(8, 3), (8, 3, 3)])
def test_rounded_onset_gradient_and_its_limit_the_hinge(nodes: tuple[int, ...]) -> None:
    """The rounded onset's analytic gradient (ω included, with and without the random
    slope) matches finite differences, and as ω → 0 it becomes the hinge."""
    data = _data(simulate_switch_data("sigmoid", 8, 40, psi_s=6.0, seed=3, intercept_sd=0.5))
    model = RandomBreakpointModel(data, nodes, detection=0.8, kind=ROUNDED, min_bend=0.0)
    kappa = [0.4] if len(nodes) > 2 else []
    theta = np.array([-2.5, 0.4, 1.5, 1.8, 0.3, *kappa, 0.7])
    _, grad = model.nll(theta)
    num = approx_fprime(theta, lambda t: model.nll(t, need_grad=False)[0], 1e-6)
    assert np.allclose(grad, num, rtol=1e-4, atol=1e-3)
    hinge = RandomBreakpointModel(data, nodes, detection=0.8, kind="hinge")
    sharp = np.r_[theta[:-1], 1e-4]
    assert model.nll(sharp)[0] == pytest.approx(hinge.nll(theta[:-1])[0], abs=1e-3)
    assert model.bounds[-1] == (0.0, 3.0)
    assert make_model(ROUNDED, data, 1.0).bounds[-1][0] == pytest.approx(MIN_BEND)
    # MIN_BEND is the width over which the slope goes from 10 % to 90 %: a factor 4 in wait.
    assert expit(math.log(ONSET_FACTOR) / 2 / MIN_BEND) == pytest.approx(0.9)


def test_the_rounded_onset_is_an_alternative_from_a_size_on() -> None:
    """By default the rounded onset joins the alternatives from 9,600 cycles (60 × 160);
    True or False overrides the rule either way."""
    assert ONSETS_FROM_CYCLES == 60 * 160
    assert not includes_onsets(None, ONSETS_FROM_CYCLES - 1)
    assert includes_onsets(None, ONSETS_FROM_CYCLES)
    assert includes_onsets(True, 10) and not includes_onsets(False, 10**6)
    small = _data(simulate_switch_data("hazard", 10, 40, seed=2, intercept_sd=0.5))
    res = threshold_test(small, 1.0, None, n_boot=1, seed=1, workers=1)
    steady = {"hinge", "slopes", "hazard", "spline", SECONDS, LINEAR_SECONDS}
    assert ROUNDED not in res.loglik and set(res.loglik) == steady
    both = threshold_test(small, 1.0, None, n_boot=1, seed=1, workers=1, onsets=True)
    assert set(both.loglik) == steady | {ROUNDED, SCURVE, SPLINE_SECONDS}
    assert set(IN_SECONDS) == {SECONDS, LINEAR_SECONDS, SPLINE_SECONDS}


def test_the_s_curves_lower_bend_spans_the_onset_factor() -> None:
    """At its narrowest width the S-curve's slope goes from 10 % to 90 % of its steepest
    over `ONSET_FACTOR` of the wait, the rounded onset's yardstick; the fit cannot go
    narrower, so at 60 × 160 a step (everyone switching above 8 s) beats it."""
    u = np.linspace(-12.0, 0.0, 240_001) * MIN_WIDTH
    slope = expit(u / MIN_WIDTH) * (1 - expit(u / MIN_WIDTH))
    rel = slope / slope.max()
    span = u[np.argmax(rel >= 0.9)] - u[np.argmax(rel >= 0.1)]
    assert math.exp(span) == pytest.approx(ONSET_FACTOR, rel=1e-3)
    assert LOWER_BEND_UNITS * MIN_WIDTH == pytest.approx(math.log(ONSET_FACTOR))
    step = _data(simulate_switch_data("hinge", 60, 160, psi_sd=0.0, seed=1))
    model = SCurveModel(step, (12, 5))
    assert model.bounds[-1][0] == pytest.approx(MIN_WIDTH)
    fit = best_fit(model, alternative_starts(SCURVE, step))
    assert fit.theta[-1] == pytest.approx(MIN_WIDTH)  # pinned at the bound
    hinge = best_fit(make_model("hinge", step, 1.0), hinge_starts(step, None))
    assert hinge.loglik > fit.loglik + 3


def test_s_curve_is_recovered_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data drawn from an S-curve (floor 5 %, ceiling 60 %, midpoint 5 s) make it the best
    alternative, beating the hinge, and the words name the S-curve and its midpoint."""
    import flowtrial.analysis.threshold_test as tt

    base = _data(simulate_switch_data("flat", 60, 80, seed=1))
    theta = np.array([-3.0, 0.4, 0.3, 3.4, math.log(5.0), 0.9])
    y = simulate_alternative(SCURVE, theta, base, 1.0, np.random.default_rng(4))
    sim = CycleData(base.x, y, base.starts, base.n_participants)
    monkeypatch.setattr(tt, "ONSETS_FROM_CYCLES", sim.x.size)
    res = threshold_test(sim, 1.0, None, n_boot=1, seed=1, workers=1)
    assert res.best == SCURVE and res.stat < 0
    mid = math.exp(res.params[SCURVE][4])
    assert mid == pytest.approx(5.0, rel=0.3)
    assert res.summary.startswith("switching rises along an S-curve rather than at a threshold")
    assert f"reached at {mid:.3g} s" in res.summary


def test_rounded_onset_is_recovered_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data drawn from a wide rounded onset give back its width, the rounded alternative
    then beats the hinge, and the words name a gradual onset, not a threshold. (The study
    is 80 × 60: the size rule is lowered to it, so the default includes the onset.)"""
    import flowtrial.analysis.threshold_test as tt

    base = _data(simulate_switch_data("flat", 80, 60, seed=1))
    theta = np.array([-3.0, 0.4, 1.5, math.log(5.0), 0.3, 1.2])
    y = simulate_alternative(ROUNDED, theta, base, 1.0, np.random.default_rng(4))
    sim = CycleData(base.x, y, base.starts, base.n_participants)
    monkeypatch.setattr(tt, "ONSETS_FROM_CYCLES", sim.x.size)
    res = threshold_test(sim, 1.0, None, n_boot=1, seed=1, workers=1)
    assert res.best == ROUNDED and res.stat < 0
    omega = res.params[ROUNDED][-1]
    assert omega == pytest.approx(1.2, abs=0.45)
    assert "gradual onset" in res.summary and "not" not in res.label


def test_the_check_and_the_cis_run_only_when_they_can_change_the_verdict() -> None:
    """A memoryless study's test does not reject, so neither the quadrature check nor the
    profile CIs are computed (there is no threshold to check or bound; the CLI test shows a
    found one has both); `add_intervals` adds the CIs a fit with them has."""
    hazard = simulate_switch_data("hazard", 20, 50, seed=5, intercept_sd=0.5)
    frame = hazard[["participant_id", "wait_s", "switched"]]
    personal, test = fit_personal_and_test(frame, workers=2, n_test=19, seed=1)
    assert test.p_value > 0.05 and personal.node_check is None
    assert personal.ci_s is None and personal.tau_ci is None
    full = fit_personal_threshold(frame, workers=2, node_check=False)
    assert full.ci_s is not None and full.ci_s[0] < full.median_psi_s < full.ci_s[1]
    assert full.median_psi_s == pytest.approx(personal.median_psi_s)
    assert add_intervals(frame, personal, workers=2) is personal
    # Adaptive quadrature centres the nodes at the estimate again for the intervals, which
    # can move the ends in the fourth digit.
    assert personal.ci_s == pytest.approx(full.ci_s, rel=2e-3)
    assert personal.tau_ci == pytest.approx(full.tau_ci, rel=2e-3, abs=2e-3)


def test_a_supported_threshold_without_its_ci_is_not_reported() -> None:
    """The verdict never reports a threshold whose CI was not computed."""
    found, reason = personal_verdict({"ci_s": None, "slope_b": 1.0}, {"p_exists": 0.001},
                                     np.array([1.0, 60.0]), test={"p_value": 0.05})
    assert not found and reason == ("No threshold: the 95 % CI of the median personal "
                                    "threshold was not computed (fit it with intervals)")


def test_a_found_headline_says_what_the_test_ruled_out() -> None:
    """Without the gradual onsets the sentence says a sharp threshold and a gradual onset are
    not told apart; with them (their fits are in the test's JSON), that they were ruled
    out."""
    from flowtrial.analysis.report_sections import threshold_headline

    found = {"found": True, "personal": {"median_psi_s": 6.04, "ci_s": [5.1, 7.2]},
             "alternatives": {"loglik": {"hinge": -1.0, "slopes": -9.0}}}
    line = threshold_headline(found, "idle wait (definition)")
    assert line.startswith("Flow threshold found: the median person's threshold is 6.04 s of "
                           "idle wait (95 % CI 5.1–7.2 s). Switching is flat below it")
    assert ("does not tell a sharp threshold from a gradual onset (rounded over up to a factor "
            "9 of the wait, or a rise ever steeper in seconds); it tests that from 9,600 cycles "
            "on.") in line
    strict = {**found, "alternatives": {"loglik": {
        "hinge": -1.0, ROUNDED: -5.0, SCURVE: -7.0, "seconds": -6.0, "spline_seconds": -6.5}}}
    assert threshold_headline(strict, "idle wait").endswith(
        "Sharper than an onset rounded over a factor 9 of the wait, an S-curve bending as "
        "gradually or a rise ever steeper in seconds (tested).")
    # A test without the spline in seconds (an earlier default) did not rule it out.
    earlier = {**found, "alternatives": {"loglik": {"hinge": -1.0, ROUNDED: -5.0, SCURVE: -7.0}}}
    assert "does not tell" in threshold_headline(earlier, "idle wait")


def test_ground_truth_coverage_is_unknown_without_a_ci() -> None:
    """A simulated threshold study whose test found none has no CI: its coverage is unknown
    (None, printed "—"), not a miss; with a CI it is checked."""
    from flowtrial.analysis.report_sections import compare_truth

    truth = {"truth_model": "hinge", "threshold_s": 6.0, "threshold_logsd": 0.35,
             "has_threshold": True}
    none = compare_truth(truth, {"personal": {"median_psi_s": 5.0, "ci_s": None}})
    assert none["ci_covers_truth"] is None and none["log_ratio"] == pytest.approx(
        math.log(5 / 6))
    some = compare_truth(truth, {"personal": {"median_psi_s": 5.0, "ci_s": [4.0, 5.5]}})
    assert some["ci_covers_truth"] is False
