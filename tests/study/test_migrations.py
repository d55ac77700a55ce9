"""Schema migrations: a database made by an older flowtrial opens in this one, keeping its
data, and ends up with exactly the schema a new database gets."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.migrate import _config, current_revision, head_revision
from flowtrial.study.participants import participant_by_key
from flowtrial.study.schema import SCHEMA_VERSION, metadata
from flowtrial.study.storage import database_url, init_db, open_db

from .conftest import make_config

DATA = Path(__file__).parent / "data"
V1_KEY = "ft_e4b61c5638d4_YHR9QLFvw5sIiA5ghHSJh7Mi7CfiulgW"


def schema_diff(url: str) -> list[object]:
    """What differs between the database's schema and the current models."""
    engine = create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), metadata()))
    finally:
        engine.dispose()


def test_database_from_flowtrial_0_1_opens_and_keeps_its_data(tmp_path: Path) -> None:
    """`v1_study.db` was written by the flowtrial before migrations existed (see data/)."""
    db = tmp_path / "old.db"
    shutil.copy(DATA / "v1_study.db", db)
    database = open_db(db)
    with database.engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM meta WHERE key='schema_version'")
                            ).scalar() == str(SCHEMA_VERSION)
        assert current_revision(conn) == head_revision()
        assert conn.execute(text("SELECT count(*) FROM cycles")).scalar() == 40
        assert conn.execute(text("SELECT count(*) FROM cycles WHERE recorded_by IS NULL")
                            ).scalar() == 40
        assert conn.execute(text("SELECT count(*) FROM participants")).scalar() == 5
        # Version 3: each participant's next per-prompt index starts past their cycles and
        # past every request index their draws recorded.
        counters = dict(conn.execute(text("SELECT participant_id, next_index FROM "
                                          "draw_counters")).all())
        count: dict[str, int] = {}
        past: dict[str, int] = {}
        for pid, draw in conn.execute(text("SELECT participant_id, draw_json FROM cycles")):
            count[pid] = count.get(pid, 0) + 1
            i = json.loads(draw).get("request_index") if draw else None
            if isinstance(i, int):
                past[pid] = max(past.get(pid, 0), i + 1)
        assert counters == {p: max(n, past.get(p, 0)) for p, n in count.items()}
        assert set(past) and len(counters) == 4
    assert participant_by_key(database, V1_KEY).id == "p-real"
    assert database.config().study.name
    database.dispose()
    assert schema_diff(str(db)) == []
    # The CLI works on it, and opening again changes nothing.
    res = CliRunner().invoke(app, ["status", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    status = json.loads(res.output)
    assert (status["participants"], status["tasks"]) == (5, 8)
    assert sum(sum(by_status.values()) for by_status in status["cycles"].values()) == 40
    assert open_db(db).study() is not None


@pytest.mark.both_backends
def test_upgrade_from_version_1_matches_a_new_database(
        new_db: Callable[[str], str | Path], backend: str) -> None:
    """Build a version-1 database with revision 0001 alone, then open it."""
    from alembic import command

    where = new_db("v1.db")
    url = database_url(where)
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0001")
        conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema_version', '1')"))
        conn.execute(text("DROP TABLE alembic_version"))  # as 0.1 made it: no alembic table
    engine.dispose()
    cfg = make_config()
    database = init_db(where, cfg)  # opens (upgrading) and adds the study
    assert "recorded_by" in {c["name"] for c in inspect(database.engine).get_columns("cycles")}
    database.dispose()
    assert schema_diff(url) == []


@pytest.mark.both_backends
def test_new_database_is_at_head(new_db: Callable[[str], str | Path], backend: str) -> None:
    where = new_db("new.db")
    init_db(where, make_config()).dispose()
    engine = create_engine(database_url(where))
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision()
    engine.dispose()
    assert schema_diff(database_url(where)) == []


def test_concurrent_openers_upgrade_once(pg_server: object) -> None:
    """Several proxies starting at once against one old PostgreSQL database."""
    from alembic import command

    url = pg_server.new_database()  # type: ignore[attr-defined]
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0001")
        conn.execute(text("INSERT INTO meta (key, value) VALUES ('schema_version', '1')"))
    engine.dispose()
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            open_db(url).dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert schema_diff(url) == []


def test_migrate_command(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copy(DATA / "v1_study.db", db)
    runner = CliRunner()
    first = runner.invoke(app, ["migrate", "--db", str(db)])
    assert first.exit_code == 0, first.output
    assert f"from schema version 1 to {SCHEMA_VERSION}" in first.output, first.output
    second = runner.invoke(app, ["migrate", "--db", str(db)])
    assert second.exit_code == 0 and "nothing to do" in second.output
    missing = runner.invoke(app, ["migrate", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 2 and "no such database" in missing.output
    assert not (tmp_path / "none.db").exists()  # nothing written
