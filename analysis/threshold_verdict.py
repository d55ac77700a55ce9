"""The flow-threshold verdict in one place (docs/concepts/analysis.md#flow-threshold): the
rules that decide whether a threshold is reported, used by `flowtrial threshold`, the
report, the dashboard (through the report's JSON) and the notebooks.

`analyse_threshold` runs the whole analysis of one cycle table (the pooled existence test,
the personal threshold and the verdict) and returns the JSON-ready answer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .personal_threshold import (
    PersonalThresholdResult,
    ProgressFn,
    _data,
    add_intervals,
    check_summary,
    fit_personal_threshold,
    hinge_theta,
    quadrature_check,
)
from .threshold import fit_threshold
from .threshold_test import ALPHA, ALT_LABELS, ThresholdTest, threshold_test

#: Null replicates of the threshold test: with 19, p <= 0.05 needs the data's statistic to
#: beat every replicate (an exact Monte Carlo test at 5 %).
DEFAULT_TEST_REPLICATES = 19
#: Largest relative change of the median threshold under the finer quadrature check that
#: still lets a threshold be reported.
MAX_NODE_CHANGE = 0.05


def personal_verdict(personal: dict[str, Any], pooled: dict[str, Any], waits_s: np.ndarray,
                     *, test: dict[str, Any] | None = None, alpha: float = ALPHA,
                     max_ci_decades: float = 1.0) -> tuple[bool, str | None]:
    """Is a personal threshold reported? In order: switching must depend on the wait (the
    pooled existence test), rise above the breakpoint (b > 0), the random-breakpoint hinge
    must beat every no-threshold alternative near the best, p <= ``alpha`` (``test``: the parametric
    bootstrap of `threshold_test`, an exact Monte Carlo test; without it, no threshold is
    claimed), and the CI of e^c (computed) must span at most ``max_ci_decades`` and stay inside the
    observed waits, and the finer quadrature check (when run) must move it by at most
    `MAX_NODE_CHANGE`.
    Returns (found, reason)."""
    p = pooled.get("p_exists")
    ci = personal["ci_s"]
    if p is None or p >= alpha:
        return False, ("No threshold: no evidence that switching depends on the wait "
                       f"(p_exists = {_num(p)} >= {alpha:g})")
    if personal["slope_b"] <= 0:
        return False, "No threshold: switching does not rise above the breakpoint (slope <= 0)"
    if test is None:
        return False, "No threshold: the test against no-threshold explanations was not run"
    if test["p_value"] > alpha:
        return False, (f"No threshold: {test['summary']}; a threshold fits no better than "
                       f"{_standing_text(test)} (p = {_num(test['p_value'])} > {alpha:g}, "
                       f"parametric bootstrap, {replicates_text(test)})")
    if ci is None:
        return False, ("No threshold: the 95 % CI of the median personal threshold was not "
                       "computed (fit it with intervals)")
    if math.log10(ci[1] / ci[0]) > max_ci_decades:
        return False, (f"No threshold: the 95 % CI of the median personal threshold "
                       f"({ci[0]:.3g}–{ci[1]:.3g} s) spans more than {max_ci_decades:g} decade")
    check = personal.get("node_check") or {}
    moved = abs(check.get("rel_change_median_psi", 0.0))
    if moved > MAX_NODE_CHANGE:
        return False, (f"No threshold: the quadrature check ({check['nodes'][0]}×"
                       f"{check['nodes'][1]} nodes) moved the median personal threshold by "
                       f"{100 * moved:.1f} % (more than {100 * MAX_NODE_CHANGE:g} %), so the "
                       "estimate is not numerically reliable")
    lo, hi = float(np.min(waits_s)), float(np.max(waits_s))
    if ci[0] <= lo * (1 + 1e-6) or ci[1] >= hi * (1 - 1e-6):
        return False, (f"No threshold: the 95 % CI of the median personal threshold "
                       f"({ci[0]:.3g}–{ci[1]:.3g} s) reaches the edge of the observed waits")
    return True, None


def replicates_text(test: dict[str, Any]) -> str:
    """"19 replicates", or "7 of up to 19 replicates" when the sequential test stopped."""
    n, most = int(test["n_boot"]), int(test.get("n_max", test["n_boot"]))
    return f"{n} replicates" if n >= most else f"{n} of up to {most} replicates"


def _standing_text(test: dict[str, Any]) -> str:
    """"this logistic in …", or, where another alternative within reach of the best is the one
    the hinge could not beat, that one."""
    standing = test.get("standing")
    if standing is None or standing == test.get("best"):
        return f"this {test['label']}"
    return f"a {ALT_LABELS[standing]}, which fits almost as well"


def _num(x: Any) -> str:
    return "—" if x is None else f"{float(x):.3g}"


def fit_personal_and_test(frame: pd.DataFrame, *, detection_share: float = 1.0,
                          workers: int | None = None, progress: ProgressFn | None = None,
                          node_check: bool = True, n_test: int = DEFAULT_TEST_REPLICATES,
                          seed: int = 0, onsets: bool | None = None, alpha: float = ALPHA,
                          intervals: bool = False, quadrature: str = "adaptive"
                          ) -> tuple[PersonalThresholdResult, ThresholdTest]:
    """The personal threshold and the test of the hinge against the no-threshold
    alternatives (`threshold_test`; ``onsets``: the gradual onsets too, None: from
    `ONSETS_FROM_CYCLES` cycles on), on the same cycles. The profile CIs of e^c and τ (the
    slowest refits) and the quadrature check (``node_check``) run only when they can matter
    to the verdict: when the test rejects at ``alpha`` and the hinge rises (otherwise there
    is no threshold to bound, ``ci_s``, ``tau_ci`` and ``node_check`` stay None);
    ``intervals``: the CIs always; ``quadrature``: the personal fit's (`QUADRATURES`; the
    test's own fits stay on the plain grid, calibrated either way)."""
    personal = fit_personal_threshold(frame, detection_share=detection_share, workers=workers,
                                      progress=progress, node_check=False, intervals=intervals,
                                      quadrature=quadrature)
    theta = hinge_theta(personal)  # with κ when people's rises differ: the test's hinge too
    rises = personal.slope_b > 0
    # With workers the check starts beside the test (it is needed only if the test rejects,
    # and a study whose test stops early never waits for it); with one, after it if needed.
    check = quadrature_check(frame, personal) if node_check and rises and workers != 1 \
        else None
    try:
        test = threshold_test(_data(frame), detection_share, theta, n_boot=n_test, seed=seed,
                              workers=workers, progress=progress, onsets=onsets,
                              alpha=alpha)
        if rises and test.p_value <= alpha:
            if personal.ci_s is None:
                add_intervals(frame, personal, workers=workers, progress=progress)
            if node_check:
                check = check or quadrature_check(frame, personal)
                check_summary(personal, check.result())
    finally:
        if check is not None:
            check.cancel()
    return personal, test


def analyse_threshold(frame: pd.DataFrame, *, detection_share: float = 1.0, n_boot: int = 200,
                      n_null: int = 200, seed: int = 0, workers: int | None = None,
                      progress: ProgressFn | None = None, node_check: bool = True,
                      n_test: int = DEFAULT_TEST_REPLICATES, alpha: float = ALPHA,
                      onsets: bool | None = None, intervals: bool = False,
                      quadrature: str = "adaptive") -> dict[str, Any]:
    """The whole threshold analysis of cycles (`participant_id`, `wait_s`, `switched`):
    ``{"found", "reason", "personal", "alternatives", "pooled"}`` as `flowtrial threshold
    --json` prints (``intervals``, ``quadrature``: `fit_personal_and_test`'s)."""
    pooled = fit_threshold(frame, n_boot=n_boot, n_null=n_null, seed=seed)
    personal, test = fit_personal_and_test(frame, detection_share=detection_share,
                                           workers=workers, progress=progress,
                                           node_check=node_check, n_test=n_test, seed=seed,
                                           onsets=onsets, alpha=alpha, intervals=intervals,
                                           quadrature=quadrature)
    pooled_d, pers, test_d = pooled.to_dict(), personal.to_dict(), test.to_dict()
    waits = frame["wait_s"].to_numpy(float)
    found, reason = personal_verdict(pers, pooled_d, waits[np.isfinite(waits) & (waits > 0)],
                                     test=test_d, alpha=alpha)
    return {"found": found, "reason": reason, "personal": pers, "alternatives": test_d,
            "pooled": pooled_d}


__all__ = ["analyse_threshold", "fit_personal_and_test", "personal_verdict", "replicates_text"]
