"""Dashboard and report agree (#20): for the same database the Flow threshold page's numbers
come from the same estimators with the report's settings, and print the same way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flowtrial.analysis.report import _fmt, _pct
from flowtrial.dashboards import compute, ui

# Fewer replicates than `flowtrial analyze`'s 200 on both sides, to keep this test short on a
# loaded 2-core machine; the settings are otherwise the report's (compute.report_settings).
N_BOOT = 19


@pytest.mark.timeout(1800)
def test_dashboard_threshold_is_the_reports(small_study: Path) -> None:
    from flowtrial.analysis.report import run_analysis
    from flowtrial.analysis.report_sections import analysable
    from flowtrial.study.storage import open_db

    report = run_analysis(small_study, None, n_boot=N_BOOT, figures=False, workers=1)
    url = open_db(small_study).url
    settings = compute.report_settings(url)
    assert settings.n_boot == 200 and settings.seed == 0  # `flowtrial analyze`'s defaults
    assert settings.all_switch_col == "switched_2s"  # the report's detection-share rule
    # The page's quicker fit differs only in its (labelled) replicates.
    assert compute.dashboard_settings(url) == dataclasses.replace(
        settings, n_boot=compute.QUICK_BOOT)
    settings = dataclasses.replace(settings, n_boot=N_BOOT)
    fresh = (-1,)  # a key of its own: no result cached by another test
    table = compute.switch_table(url, fresh, block=True)
    cyc = analysable(table, "idle_wait_s")
    key = ("agreement", url)
    summary, _res = compute.threshold_fit(key, cyc, "idle_wait_s", settings, block=True)
    personal = compute.personal_fit(key, cyc, "idle_wait_s", summary, settings, block=True)

    thr = report["threshold"]
    rp = thr["personal"]
    for k in ("psi_s", "p_exists"):
        assert summary[k] == pytest.approx(thr[k], rel=1e-9), k
    assert summary["ci_s"] == pytest.approx(thr["ci_s"], rel=1e-9)
    for k in ("median_psi_s", "tau", "detection_share"):
        assert personal[k] == pytest.approx(rp[k], rel=1e-9), k
    assert personal["ci_s"] == pytest.approx(rp["ci_s"], rel=1e-9)
    assert personal["found"] == rp["found"] and personal["reason"] == rp["reason"]
    # The same answer lengths behind "what a model speed means" (rows, or why there are none).
    assert personal["speed_table"] == rp["speed_table"]
    assert personal["speed_table"]["n_answers"] > 0
    # And the page prints them as the report does (3 significant digits).
    assert ui.num(personal["median_psi_s"]) == _fmt(rp["median_psi_s"])
    # The CI exists only when the test supports a threshold (`null` otherwise).
    assert ui.ci(personal["ci_s"], " s") == (
        f"{_fmt(rp['ci_s'][0])}–{_fmt(rp['ci_s'][1])} s" if rp["ci_s"] else "not estimated")
    assert ui.num(summary["p_exists"]) == _fmt(thr["p_exists"])


def test_numbers_rates_and_intervals_print_like_the_report() -> None:
    for x in (0.1845, 0.0, 1.0, 0.000001):
        assert ui.pct(x) == _pct(x)
    assert ui.pct(0.1845) == "18.4 %" or ui.pct(0.1845) == "18.5 %"
    for x in (8.6612, 30.0, 1.2799, 8000.0, 0.00123):
        assert ui.num(x) == _fmt(x)
    assert ui.ci([None, None], " s") == "not estimated"
    assert ui.ci(None, " s") == "not estimated"
    assert ui.ci([1.0, float("nan")], " s") == "not estimated"
    assert ui.ci([1.28, 8.66], " s") == "1.28–8.66 s"
    assert ui.num(float("nan"), " s") == "—"
    import pandas as pd

    shown = ui.displayed(pd.DataFrame({"arm": ["a"], "violation_rate": [0.1845],
                                       "cycles": [4]}))
    assert shown["violation_rate"].iloc[0] == _pct(0.1845)
    assert shown["cycles"].iloc[0] == 4
