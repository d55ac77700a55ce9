"""Randomization: Williams balance, balanced blocks, reproducibility, per-prompt draws, SRM."""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest

from flowtrial.study.config import ArmConfig, PerPromptSection, Range
from flowtrial.study.randomization import (
    crossover_arms,
    parallel_arm,
    per_prompt_draw,
    srm_check,
    williams_sequences,
)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_williams_each_arm_follows_every_other_equally(n: int) -> None:
    seqs = williams_sequences(n)
    assert len(seqs) == (n if n % 2 == 0 else 2 * n)
    for s in seqs:
        assert sorted(s) == list(range(n))  # each sequence uses every arm once
    for period in range(n):  # each arm appears equally often in each period
        counts = Counter(s[period] for s in seqs)
        assert len(set(counts.values())) == 1 and len(counts) == n
    follows = Counter((a, b) for s in seqs for a, b in pairwise(s))
    assert len(follows) == n * (n - 1)  # every ordered pair of different arms occurs...
    assert len(set(follows.values())) == 1  # ...equally often


def arms(*names: str, weights: list[float] | None = None) -> list[ArmConfig]:
    ws = weights or [1.0] * len(names)
    return [ArmConfig(name=n, weight=w) for n, w in zip(names, ws, strict=True)]


def test_parallel_blocks_are_balanced_and_reproducible() -> None:
    a = arms("fast", "slow", "mid")
    got = [parallel_arm(a, 7, i)[0] for i in range(30)]
    for b in range(10):
        assert sorted(got[3 * b: 3 * b + 3]) == ["fast", "mid", "slow"]
    assert got == [parallel_arm(a, 7, i)[0] for i in range(30)]
    assert got != [parallel_arm(a, 8, i)[0] for i in range(30)]


def test_parallel_weights_give_the_planned_ratio() -> None:
    a = arms("ctrl", "treat", weights=[1, 2])
    got = Counter(parallel_arm(a, 1, i)[0] for i in range(300))
    assert got == {"ctrl": 100, "treat": 200}


def test_crossover_deals_every_sequence_equally() -> None:
    a = arms("a", "b", "c")
    seqs = [crossover_arms(a, 3, i) for i in range(12)]
    counts = Counter(s[1] for s in seqs)
    assert sorted(counts.values()) == [2] * 6
    assert all(sorted(s[0]) == ["a", "b", "c"] for s in seqs)
    assert seqs == [crossover_arms(a, 3, i) for i in range(12)]
    assert crossover_arms(a, 3, 0, periods=5)[0][3:] == crossover_arms(a, 3, 0)[0][:2]


def test_per_prompt_draws_are_log_uniform_and_reproducible() -> None:
    pp = PerPromptSection(ttft_ms=Range(min=200, max=30000))
    draws = [per_prompt_draw(pp, 11, "p01", i)["ttft_ms"] for i in range(4000)]
    assert draws == [per_prompt_draw(pp, 11, "p01", i)["ttft_ms"] for i in range(4000)]
    assert draws[:50] != [per_prompt_draw(pp, 11, "p02", i)["ttft_ms"] for i in range(50)]
    logs = np.log(draws)
    assert min(draws) >= 200 and max(draws) <= 30000
    # Log-uniform: the mean of log draws is the midpoint of the log range.
    mid = (math.log(200) + math.log(30000)) / 2
    assert abs(logs.mean() - mid) < 4 * (math.log(150) / math.sqrt(12)) / math.sqrt(4000)
    assert per_prompt_draw(pp, 11, "p01", 0)["tokens_per_second"] is None


def test_srm_flags_a_skewed_split_only() -> None:
    planned = {"fast": 1.0, "slow": 1.0}
    assert not srm_check({"fast": 510, "slow": 490}, planned).flagged
    skew = srm_check({"fast": 600, "slow": 400}, planned)
    assert skew.flagged and skew.p_value < 0.001
    assert skew.expected == {"fast": 500.0, "slow": 500.0}
    assert not srm_check({}, planned).flagged
    weighted = srm_check({"a": 100, "b": 200}, {"a": 1, "b": 2})
    assert not weighted.flagged and weighted.chi2 == pytest.approx(0.0)
