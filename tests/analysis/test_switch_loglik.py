"""The shared per-cycle likelihood and per-person sums (`analysis/switch_loglik.py`) against
the plain formulas they replace."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, log_expit

from flowtrial.analysis.switch_loglik import WIDE_ROW, log_p, row_sums, weight_rows


def _reference(eta: np.ndarray, y: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
    """log P(observed y) and ∂/∂η from scipy's expit, written out the obvious way."""
    p = expit(eta)
    if d == 1.0:
        ll = np.where(y, log_expit(eta), log_expit(-eta))
        return ll, y - p
    prob = np.where(y, d * p, 1.0 - d * p)
    dprob = np.where(y, d, -d) * p * (1.0 - p)
    return np.log(prob), dprob / prob


@pytest.mark.parametrize("d", [1.0, 0.6])
@pytest.mark.parametrize("use_out", [False, True])
def test_log_p_matches_the_expit_formula(d: float, use_out: bool) -> None:
    rng = np.random.default_rng(3)
    eta = np.r_[rng.normal(0.0, 4.0, 400), -60.0, -30.0, 0.0, 30.0, 60.0][:, None] * np.ones(3)
    y = rng.random(eta.shape[0]) < 0.4
    y[-5:] = [True, False, True, True, False]
    y2 = y[:, None]
    sign = np.where(y2, 1.0, -1.0)
    no_switch = (~y2).astype(float)
    ref_ll, ref_score = _reference(eta, y2, d)
    work = eta.copy()
    ll, score = log_p(work, sign, no_switch, d, out=np.empty_like(work) if use_out else None)
    np.testing.assert_allclose(ll, ref_ll, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(score, ref_score, rtol=1e-10, atol=1e-13)
    if use_out:
        assert score is work  # written in place: nothing allocated on the dense pass
    else:
        np.testing.assert_array_equal(work, eta)


def test_log_p_clips_far_beyond_any_data_without_overflow() -> None:
    eta = np.array([[-1e4], [1e4]])
    with np.errstate(all="raise"):
        ll, score = log_p(eta.copy(), np.array([[1.0], [1.0]]), np.zeros((2, 1)), 1.0)
    assert ll[0, 0] == pytest.approx(-80.0) and ll[1, 0] == pytest.approx(0.0, abs=1e-30)
    assert score[0, 0] == pytest.approx(1.0) and abs(score[1, 0]) < 1e-30


@pytest.mark.parametrize("width", [5, WIDE_ROW + 36])
def test_row_sums_are_the_blocks_sums_narrow_and_wide(width: int) -> None:
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 30, 40)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    ends = np.cumsum(sizes)
    a = rng.normal(size=(int(sizes.sum()), width)).astype(np.float32)
    got = row_sums(a, starts, ends)
    want = np.stack([a[lo:hi].astype(np.float64).sum(axis=0)
                     for lo, hi in zip(starts, ends, strict=True)])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    three_d = row_sums(a.reshape(a.shape[0], -1, 1), starts, ends)
    np.testing.assert_allclose(three_d[:, :, 0], want, rtol=1e-10, atol=1e-10)


def test_weight_rows_scales_each_persons_block() -> None:
    starts, ends = np.array([0, 2, 5]), np.array([2, 5, 6])
    a = np.ones((6, 3))
    w = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    weight_rows(a, w, starts, ends)
    np.testing.assert_array_equal(a, w[[0, 0, 1, 1, 1, 2]])
