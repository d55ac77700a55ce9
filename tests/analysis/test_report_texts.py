"""Texts of the report on a tiny study (issue 20): nothing half-filled, no rate extrapolated
from seconds of work."""

from __future__ import annotations

import re
import tomllib
from html import unescape
from pathlib import Path

import pytest

from flowtrial.analysis.report import run_analysis
from flowtrial.analysis.report_sections import MIN_OBSERVED_S_PER_RATE
from flowtrial.study.config import example_study_text, parse_study
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.storage import init_db


def _study(path: Path, participants: int, prompts: int) -> Path:
    data = tomllib.loads(example_study_text())
    data["study"]["time_scale"] = 10
    config = parse_study(data)
    db = init_db(path, config)
    simulate_virtual(db, config, SimParams(), participants, tasks=1, prompts_per_task=prompts,
                     seed=5)
    db.dispose()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    db = _study(tmp_path_factory.mktemp("tiny") / "study.db", participants=1, prompts=4)
    out = db.parent / "report"
    results = run_analysis(db, out, n_boot=10, seed=0, workers=1, figures=False)
    return results, (out / "report.html").read_text(encoding="utf-8")


def test_an_unfitted_threshold_says_why_instead_of_empty_replicates(tiny: tuple[dict, str]) -> None:
    results, html = tiny
    assert results["threshold"]["psi_s"] is None
    assert "( replicates)" not in html and "(None replicates)" not in html
    assert "Not fitted:" in html


def test_cycles_per_hour_needs_enough_observed_time(tiny: tuple[dict, str]) -> None:
    results, html = tiny
    (arm,) = results["secondary"]["by_arm"]
    assert arm["n_cycles"] <= 4
    assert arm["cycles_per_hour"] is None  # a few minutes of cycles: no hourly rate
    row = re.search(r"<tr><td>per_prompt</td>(.*?)</tr>", html, re.S)
    assert row is not None and ",0" not in row.group(1)


def test_cycles_per_hour_is_reported_with_enough_observed_time(tmp_path: Path) -> None:
    db = _study(tmp_path / "study.db", participants=3, prompts=40)
    results = run_analysis(db, None, n_boot=10, seed=0, workers=1, figures=False)
    (arm,) = results["secondary"]["by_arm"]
    assert arm["cycles_per_hour"] is not None
    # 40 simulated cycles take far more than the minimum, and a person manages tens an hour.
    assert MIN_OBSERVED_S_PER_RATE == 600.0
    assert 5 < arm["cycles_per_hour"] < 300


BROKEN = ("( replicates)", "(None replicates)", "quadrature,  nodes", "— s", "None", "nan",
          "0.000000", "1 participants", "1 tasks", "1 cycles")


def _text(html: str) -> str:
    """The report's visible text (no style, no results.json), whitespace collapsed."""
    body = re.sub(r"<style>.*?</style>|<details>.*?</details>", "", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split())


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """A study with a task but no cycles (every prompt cycle removed)."""
    import sqlite3

    db = _study(tmp_path_factory.mktemp("empty") / "study.db", participants=1, prompts=4)
    con = sqlite3.connect(db)
    with con:
        con.execute("DELETE FROM events")
        con.execute("DELETE FROM cycles")
    con.close()
    out = db.parent / "report"
    results = run_analysis(db, out, n_boot=10, seed=0, workers=1, figures=False)
    return results, (out / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("which", ["tiny", "empty"])
def test_tiny_and_empty_studies_degrade_to_sentences(which: str,
                                                     request: pytest.FixtureRequest) -> None:
    results, html = request.getfixturevalue(which)
    text = _text(html)
    n = results["study"]["n_cycles"]
    assert n == (0 if which == "empty" else 4)
    for bad in BROKEN:
        assert bad not in text, (bad, which)
    assert "Personal thresholds (headline): not estimated." in text
    if which == "empty":
        assert "No flow threshold reported: need >= 20 cycles" in text
        assert "Not fitted: no variant of the wait or switch definition has enough cycles" in text
    else:  # its one simulated person never left the editor: no focus events at all
        assert "No flow threshold reported: not measured: no focus capture" in text
        assert "Not fitted: not measured: no focus capture" in text
    assert "too little data for an estimate to compare with it" in text
    assert "<th>ψ* (s)</th>" not in html  # no table of dashes
    if which == "empty":
        assert text.count("No completed cycles.") == 2
        assert "0 cycles from 0 participants" in text
    else:
        assert "1 participant · 4 cycles" in text and "1 task ·" in text


def test_tables_fit_the_page(tiny: tuple[dict, str]) -> None:
    css = re.search(r"<style>(.*?)</style>", tiny[1], re.S)
    assert css is not None
    rules = " ".join(css.group(1).split())
    assert re.search(r"table \{[^}]*max-width: 100%", rules)
    assert re.search(r"th, td \{[^}]*overflow-wrap: anywhere", rules)
    assert "overflow-x" not in rules  # nothing scrolls sideways, results.json wraps too


@pytest.fixture(scope="module")
def uncaptured(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """A study whose cycles were recorded with no focus capture and no decisions at all (every
    focus, AFK and decision event removed)."""
    import sqlite3

    db = _study(tmp_path_factory.mktemp("uncaptured") / "study.db", participants=4,
                prompts=30)
    with sqlite3.connect(db) as conn:
        n = conn.execute("DELETE FROM events WHERE kind IN ('focus_out', 'focus_in', "
                         "'afk_start', 'afk_end', 'accept', 'reject', 'partial_accept')"
                         ).rowcount
        assert n > 0
    out = db.parent / "report"
    results = run_analysis(db, out, n_boot=10, seed=0, workers=1, figures=True)
    return results, (out / "report.html").read_text(encoding="utf-8")


def test_unmeasured_is_never_zero(uncaptured: tuple[dict, str]) -> None:
    results, html = uncaptured
    s = results["secondary"]
    (arm,) = s["by_arm"]
    assert arm["n_cycles"] == 120 and arm["switches_measured"] is False
    assert arm["switch_rate"] is None and arm["acceptance_rate"] is None
    assert all(b["switch_rate"] is None for b in s["by_wait_band"])
    assert set(s["not_measured"]) == {"switch rate, resumption lag",
                                      "acceptance, partial, review time"}
    text = _text(html)
    row = re.search(r"<tr><td>per_prompt</td>(.*?)</tr>", html, re.S)
    assert row is not None and "0.0 %" not in row.group(1)
    assert "Not measured (—), switch rate, resumption lag: no focus capture" in text
    assert "Not measured (—), acceptance, partial, review time: no decisions recorded" in text
    # the threshold is not "absent": it was not measured, and says so
    thr = results["threshold"]
    assert thr["found"] is False and "not measured: no focus capture" in thr["pooled_reason"]
    assert "No flow threshold reported: not measured: no focus capture" in thr["headline"]
    assert "switch_vs_wait" not in results["figures"]


def test_per_person_curves_only_with_enough_waits(uncaptured: tuple[dict, str],
                                                  tmp_path: Path) -> None:
    # 4 people × 30 waits: with focus capture, nobody has the 40 waits a curve needs
    db = _study(tmp_path / "study.db", participants=4, prompts=30)
    results = run_analysis(db, tmp_path / "report", n_boot=10, seed=0, workers=1)
    curves = results["per_person_curves"]
    assert curves == {"min_waits": 40, "drawn": 0, "too_few": 4}
    assert "participants" not in results["figures"]
    text = _text((tmp_path / "report" / "report.html").read_text(encoding="utf-8"))
    assert "No per-participant curves: no participant has the 40 measured waits" in text
