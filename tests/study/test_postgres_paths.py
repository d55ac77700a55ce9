"""Every storage path through the CLI on PostgreSQL gives what it gives on SQLite.

The same seeded study is simulated into a SQLite file and into a real PostgreSQL database;
status, analysis, export and persistence must then agree — so schema creation, bulk writes,
analysis reads and idempotent inserts behave the same on both backends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from tests.pg_server import PgServer

runner = CliRunner()


def cli(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def run_chain(db: str, study: Path, out: Path) -> dict[str, Any]:
    cli("simulate", "--study", str(study), "--db", db, "--participants", "8", "--tasks", "2",
        "--prompts-per-task", "10", "--seed", "5")
    status = json.loads(cli("status", "--db", db, "--json"))
    results = json.loads(cli("analyze", "--db", db, "--out", str(out / "report"), "--json",
                             "--n-boot", "20", "--seed", "0"))
    cli("export", "--db", db, "--out", str(out / "export"))
    cli("persistence", "--db", db)
    again = cli("persistence", "--db", db)  # idempotent: nothing new the second time
    return {"status": status, "results": results, "again": again,
            "export": out / "export"}


def _strip_volatile(obj: Any) -> Any:
    """Drop what differs between any two runs (timestamps, paths, database names)."""
    volatile = {"generated_at", "created_at", "db", "database", "path", "url", "out",
                "report", "elapsed_s", "seconds"}
    if isinstance(obj, dict):
        return {k: _strip_volatile(v) for k, v in obj.items() if k not in volatile}
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    if isinstance(obj, float):
        return round(obj, 9)
    return obj


def test_cli_chain_agrees_between_sqlite_and_postgresql(
        tmp_path: Path, pg_server: PgServer, study_file: Path) -> None:
    lite = run_chain(str(tmp_path / "s.db"), study_file, tmp_path / "lite")
    pg = run_chain(pg_server.new_database(), study_file, tmp_path / "pg")
    assert _strip_volatile(lite["status"]) == _strip_volatile(pg["status"])
    assert _strip_volatile(lite["results"]) == _strip_volatile(pg["results"])
    assert "0 new" in pg["again"] or "no new" in pg["again"].lower(), pg["again"]
    files = sorted(p.name for p in lite["export"].iterdir())
    assert files == sorted(p.name for p in pg["export"].iterdir()) and "cycles.csv" in files
    for name in files:
        a, b = (pd.read_csv(d["export"] / name) for d in (lite, pg))
        assert list(a.columns) == list(b.columns) and len(a) == len(b), name
        # Creation times and random key material differ between any two runs.
        keep = [c for c in a.columns if not c.endswith("_at") and not c.startswith("key_")]
        a, b = (x[keep].sort_values(keep).reset_index(drop=True) for x in (a, b))
        pd.testing.assert_frame_equal(a, b, check_dtype=False, obj=name)


@pytest.mark.parametrize("bad", ["postgresql://flowtrial@127.0.0.1:1/nowhere",
                                 "mysql://x@127.0.0.1/db"])
def test_unreachable_or_unsupported_database_is_one_line_exit_2(bad: str) -> None:
    res = runner.invoke(app, ["status", "--db", bad])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and ("cannot open" in line or "unsupported database" in line)
