"""The dashboard's freshness token (``data.freshness``), on SQLite and PostgreSQL: it runs on
every rerun, so it must not read the events table whole, yet a new batch of events, and a
withdrawal that deletes rows, must still change it (and so refresh the cached tables)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from flowtrial.dashboards import data
from flowtrial.study.participation import withdraw
from flowtrial.study.schema import Event
from flowtrial.study.storage import WriteBatch, database_url, open_db, utcnow, write_rows
from tests.dashboards.conftest import simulated_parallel_study
from tests.pg_server import PgServer


@pytest.fixture(params=["sqlite", "postgresql"])
def study_url(request: pytest.FixtureRequest, small_study: Path,
              tmp_path: Path) -> Iterator[str]:
    """A study of its own (this test writes to it): a copy of ``small_study`` on SQLite, the
    same simulation on PostgreSQL."""
    if request.param == "sqlite":
        shutil.copy(small_study, tmp_path / "study.db")
        yield database_url(tmp_path / "study.db")
        return
    server: PgServer = request.getfixturevalue("pg_server")
    url = server.new_database()
    simulated_parallel_study(url, 3, 1, 4)
    yield url


def events_counted(url: str) -> int:
    """Events as the Overview page shows them (``study_info``, cached on the token)."""
    return int(data.study_info(url, data.freshness(url)).status["events"])


def test_a_new_batch_and_a_deletion_change_the_token(study_url: str) -> None:
    db = open_db(study_url)
    pid, other = data.filter_options(study_url, data.freshness(study_url))["participants"][:2]
    before, n = data.freshness(study_url), events_counted(study_url)
    assert data.freshness(study_url) == before  # unchanged study, unchanged token
    batch = [{"participant_id": pid, "kind": "agent_wait", "ts_ns": 1_700_000_000 * 10**9 + i,
              "duration_s": 1.0, "source": "continue", "received_at": utcnow()}
             for i in range(3)]
    write_rows(db, [WriteBatch(Event, batch)])
    after = data.freshness(study_url)
    assert after != before
    assert events_counted(study_url) == n + 3  # the cached count was re-read
    withdraw(db, other, delete_data=True)  # deletes rows, not the newest events
    gone = data.freshness(study_url)
    assert gone != after and gone[2] == after[2]  # the last event id did not move
    assert events_counted(study_url) < n
    db.dispose()


def test_the_token_reads_no_big_table_whole(small_study: Path) -> None:
    """SQLite's own plan of every statement the token runs: the events and tasks tables are
    searched (one step down the primary key), never scanned."""
    url = database_url(small_study)
    engine = data.database(url).engine
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        data.freshness(url)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    plans = []
    with engine.connect() as conn:
        for sql in seen:
            plans += [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
    assert any("events" in p for p in plans), plans
    assert not [p for p in plans if p.startswith("SCAN") and ("events" in p or "tasks" in p)], \
        plans
