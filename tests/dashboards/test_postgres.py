"""The dashboard on PostgreSQL: the same study gives the same tables as on SQLite, and every
page renders (the dashboard's SQL runs on both backends)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from flowtrial.dashboards import data, team_data
from flowtrial.dashboards.filters import Filters
from flowtrial.study.storage import database_url
from tests.dashboards.conftest import APP, PAGES, simulated_parallel_study
from tests.pg_server import PgServer


@pytest.fixture(scope="module")
def pg_small_study(pg_server: PgServer) -> str:
    """The ``small_study`` fixture's study, simulated with the same seed into PostgreSQL."""
    url = pg_server.new_database()
    simulated_parallel_study(url, 6, 2, 10)
    return url


def tables(url: str) -> dict[str, object]:
    fresh = data.freshness(url)
    f = Filters()
    info = data.study_info(url, fresh)
    pid = data.filter_options(url, fresh)["participants"][0]
    days = data.participant_days(url, fresh, pid)
    out: dict[str, object] = {
        "arms": data.arm_summary(url, fresh, 1.0, f),
        "hist": data.histograms(url, fresh, 1.0, f),
        "decisions": data.decisions_by_arm(url, fresh, f),
        "tasks": data.task_times(url, fresh, 1.0, f),
        **{f"team_{by}": team_data.weekly(url, fresh, team_data.team_query(
            url, "parallel", by, 300.0, 1.0, f)) for by in ("person", "agent", "model")},
        "team_bins": team_data.wait_bins(url, fresh, team_data.team_query(
            url, "parallel", "person", 300.0, 1.0, f)),
        "slow_only": data.arm_summary(url, fresh, 1.0, Filters(arms=("slow",))),
        "days": days,
        "options": data.filter_options(url, fresh),
        "name": info.name if hasattr(info, "name") else info,
    }
    for k, v in data.participant_day_tables(url, fresh, pid, days[0]).items():
        out[f"day_{k}"] = v
    return out


def test_dashboard_tables_agree_with_sqlite(small_study: Path, pg_small_study: str) -> None:
    lite, pg = tables(database_url(small_study)), tables(pg_small_study)
    assert lite.keys() == pg.keys()
    for key in lite:
        a, b = lite[key], pg[key]
        if isinstance(a, pd.DataFrame):
            assert isinstance(b, pd.DataFrame) and len(a) > 0 or key.startswith("day_"), key
            pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True),
                                          check_dtype=False, obj=key)
        else:
            assert a == b, key


def test_every_page_renders_on_postgresql(pg_small_study: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_DB", pg_small_study)
    # Five pages against a real PostgreSQL server took ~50 s of a 60 s budget on a loaded
    # 2-core machine: the budget is per script run, and a cold page may take most of it.
    at = AppTest.from_file(str(APP), default_timeout=180)
    for page in PAGES:
        (at if page == PAGES[0] and not at.session_state else at.switch_page(page)).run()
        assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
        assert not at.error, f"{page}: {[e.value for e in at.error]}"
    assert next(m.value for m in at.metric if m.label.startswith("People")) == "6"
