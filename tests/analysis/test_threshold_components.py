"""The threshold test as an intersection-union test: the hinge must beat every alternative
near the best (`threshold_test.contenders`), each by its own parametric bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

import flowtrial.analysis.threshold_test as tt
from flowtrial.analysis.rb_model import CycleData
from flowtrial.analysis.threshold_test import (
    ALT_LABELS,
    CONTENDER_GAP,
    LINEAR_SECONDS,
    SECONDS,
    contenders,
    sequential_p,
    stop_count,
    threshold_test,
)
from flowtrial.analysis.threshold_truth import simulate_switch_data
from flowtrial.analysis.threshold_verdict import personal_verdict


def _data(df) -> CycleData:  # noqa: ANN001
    return CycleData.from_arrays(np.log(df["wait_s"].to_numpy()), df["switched"].to_numpy(),
                                 df["participant_id"].to_numpy())


def test_contenders_are_the_alternatives_near_the_best_best_first() -> None:
    ll = {"slopes": -510.0, "hazard": -500.5, "spline": -499.0, SECONDS: -503.0,
          LINEAR_SECONDS: -500.0}
    assert contenders(ll, 2.0) == ["spline", LINEAR_SECONDS, "hazard"]
    assert contenders(ll, 0.5) == ["spline"]
    assert contenders(ll, 100.0)[-1] == "slopes" and len(contenders(ll, 100.0)) == 5
    assert CONTENDER_GAP > 0


def test_a_threshold_must_beat_each_contender(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threshold data, every alternative made a contender: each component is bootstrapped
    from its own alternative (its own seeds), p is the largest component p, and the best's
    component is the one-alternative test (same replicates)."""
    hinge = _data(simulate_switch_data("hinge", 30, 80, psi_sd=0.0, seed=1))
    monkeypatch.setattr(tt, "CONTENDER_GAP", 0.0)  # the best alone
    one = threshold_test(hinge, 1.0, None, n_boot=3, seed=1, workers=1, alpha=0.3)
    assert list(one.components) == [one.best] and one.n_max == 3
    monkeypatch.setattr(tt, "CONTENDER_GAP", 1e9)
    res = threshold_test(hinge, 1.0, None, n_boot=3, seed=1, workers=1, alpha=0.3)
    assert list(res.components) == contenders(
        {k: v for k, v in res.loglik.items() if k != "hinge"}, 1e9)
    assert len(res.components) == 5 and res.n_max == 15 and res.n_boot == 15
    assert res.p_value == max(res.components.values()) == pytest.approx(0.25)
    assert res.null_stats == one.null_stats and res.components[res.best] == one.p_value


def test_the_first_contender_that_stands_ends_the_test(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Memoryless switching: the best alternative stands, so no other is bootstrapped."""
    monkeypatch.setattr(tt, "CONTENDER_GAP", 1e9)
    hazard = _data(simulate_switch_data("hazard", 20, 50, seed=5, intercept_sd=0.5))
    res = threshold_test(hazard, 1.0, None, n_boot=19, seed=1, workers=1)
    assert list(res.components) == [res.best] and res.standing == res.best
    assert res.p_value > 0.05 and res.n_boot < 19 and res.n_max == 19 * 5
    assert res.p_value == sequential_p(res.null_stats, res.stat, 19, stop_count(19))


def test_the_verdict_names_the_alternative_that_stood() -> None:
    """The best alternative beaten, one almost as good not: the reason names that one."""
    test = {"p_value": 0.2, "summary": "switching rises steadily with the wait: …",
            "label": ALT_LABELS[LINEAR_SECONDS], "best": LINEAR_SECONDS, "standing": SECONDS,
            "components": {LINEAR_SECONDS: 0.05, SECONDS: 0.2}, "n_boot": 21, "n_max": 38}
    found, reason = personal_verdict({"ci_s": [4.0, 8.0], "slope_b": 1.5}, {"p_exists": 0.01},
                                     np.array([0.2, 60.0]), test=test)
    assert not found
    assert f"no better than a {ALT_LABELS[SECONDS]}, which fits almost as well" in str(reason)
    assert "21 of up to 38 replicates" in str(reason)
    same = personal_verdict({"ci_s": [4.0, 8.0], "slope_b": 1.5}, {"p_exists": 0.01},
                            np.array([0.2, 60.0]), test={**test, "standing": LINEAR_SECONDS})
    assert f"this {ALT_LABELS[LINEAR_SECONDS]}" in str(same[1])
