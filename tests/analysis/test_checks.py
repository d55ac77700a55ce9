"""Checks first: SRM, carry-over, manipulation, missing data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from flowtrial.analysis import AnalysisInputError
from flowtrial.analysis.checks import carryover_check, missing_data, srm_check


def test_srm_balanced_is_ok_and_skewed_is_flagged() -> None:
    planned = {"fast": 0.5, "slow": 0.5}
    ok = srm_check({"fast": 1010, "slow": 990}, planned)
    assert ok.ok and not ok.flagged and ok.p_value > 0.5
    bad = srm_check({"fast": 1100, "slow": 900}, planned)
    assert bad.flagged and not bad.ok and bad.p_value < 0.001
    assert bad.expected == {"fast": 1000.0, "slow": 1000.0}
    json.dumps(bad.to_dict())


def test_srm_weights_are_normalised_and_unplanned_arms_flagged() -> None:
    assert srm_check({"a": 1000, "b": 2000}, {"a": 1, "b": 2}).ok
    assert srm_check({"a": 1000, "b": 1000}, {"a": 1, "b": 2}).flagged
    odd = srm_check({"a": 500, "b": 500, "c": 3}, {"a": 1, "b": 1})
    assert odd.flagged and odd.unplanned == ["c"]
    with pytest.raises(AnalysisInputError):
        srm_check({"a": 1}, {"a": 0.0, "b": 1.0})


def _crossover(carry: float, seed: int) -> pd.DataFrame:
    """AB/BA crossover, 40 participants × 2 periods × 3 tasks; `carry` = extra log time in
    period 2 after the fast arm (a first-order carry-over)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(40):
        seq = ["fast", "slow"] if i % 2 == 0 else ["slow", "fast"]
        u = rng.normal(0, 0.3)
        for period, arm in enumerate(seq):
            for _ in range(3):
                log_t = 7 + u - 0.2 * (arm == "fast") + 0.05 * period + rng.normal(0, 0.3)
                if period == 1 and seq[0] == "fast":
                    log_t += carry
                rows.append(
                    {
                        "participant_id": f"p{i}",
                        "period": period,
                        "arm": arm,
                        "task_time_s": float(np.exp(log_t)),
                    }
                )
    return pd.DataFrame(rows)


def test_carryover_detected_when_present() -> None:
    strong = carryover_check(_crossover(carry=1.0, seed=1))
    assert not strong.ok and strong.p_value < 0.01
    assert strong.df_num == 1 and strong.df_denom == 39 and strong.terms
    none = carryover_check(_crossover(carry=0.0, seed=2))
    assert none.p_value > strong.p_value
    json.dumps(none.to_dict())


def test_carryover_bad_input() -> None:
    df = _crossover(0.0, 0)
    with pytest.raises(AnalysisInputError, match="not found"):
        carryover_check(df, outcome="nope")
    with pytest.raises(AnalysisInputError, match="2 periods"):
        carryover_check(df[df["period"] == 0])


def test_missing_data_flags_differential_missingness() -> None:
    rng = np.random.default_rng(3)
    arm = np.repeat(["a", "b"], 500)
    even = pd.DataFrame({"arm": arm, "x": np.where(rng.random(1000) < 0.05, np.nan, 1.0)})
    res = missing_data(even, "arm", ["x"])
    assert res.ok and res.by_column[0]["rate"] == pytest.approx(0.05, abs=0.02)
    skew = pd.DataFrame(
        {
            "arm": arm,
            "x": np.where(rng.random(1000) < np.where(arm == "a", 0.02, 0.12), np.nan, 1.0),
        }
    )
    res = missing_data(skew, "arm", ["x"])
    assert not res.ok and "different rates" in res.problems[0]
    by_arm = {r["arm"]: r["rate"]["x"] for r in res.by_arm}
    assert by_arm["b"] > by_arm["a"]
    json.dumps(res.to_dict())
    with pytest.raises(AnalysisInputError):
        missing_data(skew, "arm", ["y"])


def test_missing_data_accounts_for_participants_and_multiplicity() -> None:
    rng = np.random.default_rng(4)
    # 20 participants × 50 cycles, arm randomized per cycle; missingness is a property of
    # the participant (some lose many values), not of the arm.
    pid = np.repeat(np.arange(20), 50)
    arm = rng.choice(["a", "b"], size=1000)
    cols = {f"x{k}": np.where(rng.random(1000) < rng.beta(0.4, 2, size=20)[pid], np.nan, 1.0)
            for k in range(7)}
    df = pd.DataFrame({"arm": arm, "pid": pid, **cols})
    clustered = missing_data(df, "arm", list(cols), cluster="pid", max_rate=1.0)
    assert clustered.ok
    holm = [r["p_holm"] for r in clustered.by_column]
    raw = [r["p_differential"] for r in clustered.by_column]
    assert all(h >= p for h, p in zip(holm, raw, strict=True)) and max(holm) <= 1.0
    # Arm randomized per participant (parallel): the same clustered missingness would often
    # look "differential" to a χ² test that counts cycles as independent.
    par = df.assign(arm=np.where(pid % 2 == 0, "a", "b"))
    naive = missing_data(par, "arm", list(cols), max_rate=1.0)
    robust = missing_data(par, "arm", list(cols), cluster="pid", max_rate=1.0)
    assert sum(r["p_differential"] < 0.05 for r in naive.by_column) > sum(
        r["p_differential"] < 0.05 for r in robust.by_column)
    skew = pd.DataFrame({"arm": arm, "pid": pid,
                         "x": np.where(rng.random(1000) < np.where(arm == "a", 0.02, 0.2),
                                       np.nan, 1.0)})
    assert not missing_data(skew, "arm", ["x"], cluster="pid").ok
