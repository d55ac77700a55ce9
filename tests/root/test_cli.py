"""The CLI through typer's runner, asserting on the database it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from sqlalchemy import text
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.storage import open_db

runner = CliRunner()


def test_init_writes_a_valid_example(tmp_path: Path) -> None:
    target = tmp_path / "study.toml"
    r = runner.invoke(app, ["init", str(target)])
    assert r.exit_code == 0, r.output
    assert "[[arms]]" in target.read_text()
    r = runner.invoke(app, ["init", str(target)])
    assert r.exit_code == 2
    assert "already exists: pass --force" in r.output


def test_enroll_prints_key_once_and_stores_hash(tmp_path: Path, parallel_file: Path) -> None:
    db = tmp_path / "s.db"
    keys = []
    for pid in ["p01", "p02", "p03", "p04"]:
        r = runner.invoke(app, ["enroll", "--study", str(parallel_file), "--db", str(db),
                                "--participant", pid])
        assert r.exit_code == 0, r.output
        keys.append(r.output.strip().splitlines()[-1])
    assert all(k.startswith("ft_") for k in keys)
    database = open_db(db)
    with database.engine.connect() as c:
        rows = c.execute(text("SELECT * FROM participants")).mappings().all()
        arms = c.execute(text("SELECT arm FROM assignments ORDER BY participant_id")).scalars()
        arms = list(arms)
    assert len(rows) == 4
    assert sorted(arms) == ["fast", "fast", "slow", "slow"]  # balanced blocks of two
    dump = db.read_bytes() + (db.parent / "s.db-wal").read_bytes() if (
        db.parent / "s.db-wal").exists() else db.read_bytes()
    for k in keys:
        assert k.encode() not in dump


def test_enroll_duplicate_and_bad_study(tmp_path: Path, study_file: Path) -> None:
    db = tmp_path / "s.db"
    args = ["enroll", "--study", str(study_file), "--db", str(db), "--participant", "p01"]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already enrolled" in r.output
    bad = tmp_path / "bad.toml"
    text = study_file.read_text()
    bad.write_text(text.replace("tokens_per_second = 50", "tokens_per_second = 0"))
    r = runner.invoke(app, ["enroll", "--study", str(bad), "--db", str(tmp_path / "b.db"),
                            "--participant", "p01"])
    assert r.exit_code == 2
    assert "arms[1].tokens_per_second: must be > 0" in r.output
    assert not (tmp_path / "b.db").exists()  # nothing written


def test_status_json_and_table(tmp_path: Path, parallel_file: Path) -> None:
    db = tmp_path / "s.db"
    for pid in ["a", "b"]:
        runner.invoke(app, ["enroll", "--study", str(parallel_file), "--db", str(db),
                            "--participant", pid])
    r = runner.invoke(app, ["status", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)
    assert st["participants"] == 2 and st["assignments"] == {"fast": 1, "slow": 1}
    assert st["srm"]["flagged"] is False
    r = runner.invoke(app, ["status", "--db", str(db)])
    assert r.exit_code == 0 and "Sample-ratio check" in r.output
    r = runner.invoke(app, ["status", "--db", str(tmp_path / "missing.db")])
    assert r.exit_code == 2 and "no such database" in r.output


def test_export_csv_and_deidentified(tmp_path: Path, study_file: Path) -> None:
    db = tmp_path / "s.db"
    runner.invoke(app, ["enroll", "--study", str(study_file), "--db", str(db),
                        "--participant", "alice01"])
    out = tmp_path / "out"
    r = runner.invoke(app, ["export", "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    parts = pd.read_csv(out / "participants.csv")
    assert list(parts["id"]) == ["alice01"]
    assert "key_hash" not in parts.columns and "key_salt" not in parts.columns
    out2 = tmp_path / "deid"
    r = runner.invoke(app, ["export", "--db", str(db), "--out", str(out2), "--deidentify",
                            "--format", "parquet"])
    assert r.exit_code == 0, r.output
    parts = pd.read_parquet(out2 / "participants.parquet")
    assert parts["id"][0].startswith("h_") and "alice01" not in parts.to_csv()
    cycles = pd.read_parquet(out2 / "cycles.parquet")
    assert "content_text" not in cycles.columns and "prompt_fingerprint" not in cycles.columns
    r = runner.invoke(app, ["export", "--db", str(db), "--format", "xlsx"])
    assert r.exit_code == 2 and "use csv or parquet" in r.output
