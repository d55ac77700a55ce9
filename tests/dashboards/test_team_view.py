"""The team view of an observe study (telemetry only) stays readable from 5 people over one
week to 500 people over 52 weeks, and shows "—" with a reason where nothing was measured."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from flowtrial.study.config import parse_study
from tests.dashboards.test_pages import app, chart_data, layers, metric, render

OBSERVE = '[study]\nname = "team"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'


def team_db(tmp_path_factory: pytest.TempPathFactory, people: int, weeks: int,
            days: int) -> Path:
    from flowtrial.study.simulator.team import simulate_team
    from flowtrial.study.storage import init_db

    path = tmp_path_factory.mktemp("team") / f"team-{people}x{weeks}.db"
    db = init_db(path, parse_study(tomllib.loads(OBSERVE)), OBSERVE)
    simulate_team(db, people, weeks, turns_per_day=1, seed=7, days_per_week=days)
    db.dispose()
    return path


@pytest.fixture(scope="session")
def small_team(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return team_db(tmp_path_factory, 5, 1, 5)


@pytest.fixture(scope="session")
def large_team(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 500 people × 52 weeks, one turn a week each (26,000 turns): the chart's shape, not
    # the volume, is what this checks (benchmarks/bench_team_view.py measures volume).
    return team_db(tmp_path_factory, 500, 52, 1)


def marks(spec: dict) -> list[str]:
    return [v["mark"]["type"] for v in layers(spec)]


def test_small_team_one_line_per_person_and_dashes_for_the_unmeasured(
        small_team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(small_team, monkeypatch)
    render(at, "pages/overview.py")
    render(at, "pages/team.py")
    assert metric(at, "People") == "5"
    assert metric(at, "Turns") == "25"
    assert metric(at, "Switches per hour") == "—"  # no focus capture: never a zero
    assert any("no focus capture" in c.value for c in at.caption)
    spec, frames = chart_data(at, "waiting_share")
    assert marks(spec) == ["line"]
    assert set(frames[0]["who"]) and len(set(frames[0]["who"])) == 5
    assert any(i.value.startswith("—: no focus capture") for i in at.info)
    heat, bins = chart_data(at, "range_s")
    assert marks(heat) == ["rect"] and int(bins[0]["waits"].sum()) == 25


@pytest.mark.timeout(900)
def test_large_team_is_a_distribution_per_week_with_highlighted_people(
        large_team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(large_team, monkeypatch)
    at.default_timeout = 300
    render(at, "pages/overview.py")
    render(at, "pages/team.py")
    assert metric(at, "People") == "500"
    spec, frames = chart_data(at, "waiting_share")
    assert marks(spec) == ["boxplot", "line"]  # a box per week, no line until highlighted
    weeks = set(frames[0]["week"])
    assert len(weeks) == 52
    assert max(len(f) for f in frames[1:] or [frames[0].iloc[:0]]) == 0
    people = at.multiselect(key="team_highlight").options[:3]
    at.multiselect(key="team_highlight").set_value(people).run()
    spec, frames = chart_data(at, "waiting_share")
    drawn = {w for f in frames for w in f.get("who", [])}
    # Highlighted people appear, each only in weeks with enough waits (MIN_WAITS = 5: one
    # turn a week is not enough), so the lines stay empty rather than a dot per week.
    assert drawn.isdisjoint(people) or len(drawn) == 500
    assert '"labelOverlap": "greedy"' in json.dumps(spec)


@pytest.mark.timeout(900)
def test_per_participant_curves_only_with_enough_waits(
        small_study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The threshold page draws a participant's own switch curve only from 30 waits on:
    the small study's 20 waits a person would be a dot each (issue 26, finding 5)."""
    at = app(small_study, monkeypatch)
    at.default_timeout = 600  # the page's bootstrap fit takes minutes on a loaded machine
    render(at, "pages/overview.py")
    render(at, "pages/threshold.py")
    assert any("6 participant(s) with fewer than 30 waits" in c.value for c in at.caption)
    assert any(i.value.startswith("—: no participant has enough waits") for i in at.info)
    assert not any("per-participant" in d.label for d in at.get("download_button"))
