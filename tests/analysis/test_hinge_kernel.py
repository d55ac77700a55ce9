"""The hinge computed only where it is active (`hinge_kernel`) against the dense pass over
every cycle and node: the same likelihood and gradient, including people with no cycle
above (or below) some breakpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowtrial.analysis.rb_model import CycleData, RandomBreakpointModel
from flowtrial.analysis.threshold_truth import simulate_switch_data


def _data() -> CycleData:
    df = simulate_switch_data("hinge_slopes", 12, 30, psi_s=6.0, intercept_sd=0.5, seed=5)
    x = np.log(df["wait_s"].to_numpy())
    pid = df["participant_id"].to_numpy()
    # One person waits only briefly, one only long: below / above every breakpoint node.
    people = np.unique(pid)
    x[pid == people[0]] = np.log(0.2)
    x[pid == people[1]] = np.log(200.0)
    return CycleData.from_arrays(x, df["switched"].to_numpy(), pid)


@pytest.mark.parametrize("kind", ["hinge", "hinge_tau0", "hinge_two_groups"])
@pytest.mark.parametrize("nodes", [(12, 5), (12, 5, 5), (24, 7)])
@pytest.mark.parametrize("detection", [1.0, 0.6])
def test_active_only_pass_equals_dense_pass(kind: str, nodes: tuple[int, ...],
                                            detection: float) -> None:
    data = _data()
    fast = RandomBreakpointModel(data, nodes, detection=detection, kind=kind)
    dense = RandomBreakpointModel(data, nodes, detection=detection, kind=kind, dense=True)
    rng = np.random.default_rng(7)
    base = np.array([-2.0, 0.5, 1.2, math.log(6.0), 0.5, 0.6])[:fast.n_params]
    for _ in range(4):
        theta = base + rng.normal(0.0, 0.4, base.size)
        theta[1:] = np.r_[abs(theta[1]), theta[2:4], np.abs(theta[4:])]
        f1, g1 = fast.nll(theta)
        f2, g2 = dense.nll(theta)
        assert f1 == pytest.approx(f2, rel=1e-10)
        assert np.allclose(g1, g2, rtol=1e-8, atol=1e-8)
        assert fast.nll(theta, need_grad=False)[0] == f1


def test_breakpoint_beyond_every_wait() -> None:
    """A breakpoint above every wait leaves no active cycle: the flat model's likelihood,
    and no slope gradient."""
    data = _data()
    theta = np.array([-1.0, 0.3, 1.0, math.log(1e4), 0.0])
    f1, g1 = RandomBreakpointModel(data, (12, 5)).nll(theta)
    f2, g2 = RandomBreakpointModel(data, (12, 5), dense=True).nll(theta)
    assert f1 == pytest.approx(f2, rel=1e-12)
    assert g1[2] == g1[3] == 0.0 and np.allclose(g1, g2)


@pytest.mark.parametrize("kind", ["hinge", "rounded"])
@pytest.mark.parametrize("detection", [1.0, 0.6])
def test_float32_work_arrays_agree_with_float64(kind: str, detection: float) -> None:
    """The threshold test's fits use float32 work arrays (`threshold_test.TEST_DTYPE`): the
    likelihood and gradient stay within float32 rounding of float64's, far below what moves
    a verdict (sums over cycles are float64)."""
    data = _data()
    base = np.array([-2.0, 0.5, 1.2, math.log(6.0), 0.5, 0.6, 0.8])
    m64 = RandomBreakpointModel(data, (12, 5, 5), detection=detection, kind=kind)
    m32 = RandomBreakpointModel(data, (12, 5, 5), detection=detection, kind=kind,
                                dtype=np.float32)
    theta = base[:m64.n_params]
    f64, g64 = m64.nll(theta)
    f32, g32 = m32.nll(theta)
    assert f32 != f64  # float32 did run
    assert f32 == pytest.approx(f64, rel=1e-6, abs=1e-4)
    assert np.allclose(g32, g64, rtol=1e-4, atol=1e-3)
