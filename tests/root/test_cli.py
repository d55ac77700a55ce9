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


def test_enroll_duplicate_and_bad_study(tmp_path: Path, study_file: Path,
                                        parallel_file: Path) -> None:
    db = tmp_path / "s.db"
    args = ["enroll", "--study", str(study_file), "--db", str(db), "--participant", "p01"]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already enrolled" in r.output
    bad = tmp_path / "bad.toml"
    text = parallel_file.read_text()
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


def test_enroll_says_what_the_design_assigned(tmp_path: Path, parallel_file: Path,
                                               study_file: Path) -> None:
    r = runner.invoke(app, ["enroll", "--study", str(parallel_file), "--db",
                            str(tmp_path / "p.db"), "--participant", "p01"])
    assert r.exit_code == 0, r.output
    assert "Enrolled p01: arm fast." in r.output and "period" not in r.output
    r = runner.invoke(app, ["enroll", "--study", str(study_file), "--db",
                            str(tmp_path / "pp.db"), "--participant", "p01"])
    assert r.exit_code == 0, r.output
    assert "Enrolled p01: each prompt draws its own latency" in r.output


def test_the_init_template_promises_validate_and_validate_keeps_it(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    assert runner.invoke(app, ["init", str(study)]).exit_code == 0
    head = study.read_text().splitlines()[0]
    assert f"flowtrial validate --study {study.name}" in head
    r = runner.invoke(app, ["validate", "--study", str(study)])
    assert r.exit_code == 0, r.output
    assert f"{study}: valid." in r.output
    assert "design per_prompt, unit prompt" in r.output
    assert "per prompt: TTFT 200–30000 ms (log)" in r.output
    # The per-prompt template has no arms (switching design is a comment), so no warning.
    assert "warning:" not in r.output and "arm " not in r.output
    assert not list(tmp_path.glob("*.db"))  # validate touches no database


def test_validate_lists_every_problem_on_its_own_line(tmp_path: Path, parallel_file: Path) -> None:
    r = runner.invoke(app, ["validate", "--study", str(parallel_file)])
    assert r.exit_code == 0, r.output
    assert "arm fast: TTFT 200 ms" in r.output and "warning" not in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text(parallel_file.read_text().replace("tokens_per_second = 50",
                                                     "tokens_per_second = 0")
                   .replace('name = "fast"', 'name = "fast"\ncolour = "red"'))
    r = runner.invoke(app, ["validate", "--study", str(bad)])
    assert r.exit_code == 2
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {bad}: arms[0].colour: unknown key (check its spelling against "
                      "`flowtrial init`'s example)",
                      f"error: {bad}: arms[1].tokens_per_second: must be > 0"], r.output
    r = runner.invoke(app, ["validate", "--study", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "file not found" in r.output


def test_usage_errors_are_one_line_with_exit_code_2() -> None:
    for args, expected in [
        (["status"], "error: flowtrial status: missing option '--db' "
                     "(see `flowtrial status --help`)"),
        (["status", "--db"], "error: flowtrial status: option '--db' requires an argument "
                             "(see `flowtrial status --help`)"),
        (["no-such-command"], "error: flowtrial: no such command 'no-such-command' "
                              "(see `flowtrial --help`)"),
        (["--bogus"], "error: flowtrial: no such option: --bogus (see `flowtrial --help`)"),
    ]:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.strip() == expected, (args, r.output)


def test_flags_show_no_value_type_in_help() -> None:
    """Typer's rich help printed ``--json <bool>`` and ``--help <bool>``: flags take no value."""
    for args in (["--help"], ["status", "--help"], ["init", "--help"]):
        r = runner.invoke(app, args, env={"COLUMNS": "100"})
        assert r.exit_code == 0, r.output
        assert "<bool>" not in r.output, r.output
    r = runner.invoke(app, ["status", "--help"], env={"COLUMNS": "100"})
    assert "--db" in r.output and "<str>" in r.output  # options that take a value keep their type
    assert "--json" in r.output


def test_enroll_in_a_crossover_names_the_arms_by_period(tmp_path: Path,
                                                        parallel_file: Path) -> None:
    crossover = tmp_path / "crossover.toml"
    crossover.write_text(parallel_file.read_text().replace(
        'design = "parallel"', 'design = "crossover"').replace(
        'unit = "participant"', 'unit = "task"'))
    r = runner.invoke(app, ["enroll", "--study", str(crossover), "--db",
                            str(tmp_path / "c.db"), "--participant", "p01"])
    assert r.exit_code == 0, r.output
    line = r.output.splitlines()[0]
    assert line in ("Enrolled p01: arms by period fast → slow.",
                    "Enrolled p01: arms by period slow → fast."), r.output


def test_per_prompt_template_and_demo_agree_on_arms(tmp_path: Path) -> None:
    """A per-prompt study has no arms: the template warns of none, stores and exports none,
    and its sample-ratio line is the demo's."""
    from flowtrial.demo import demo_study_text

    template = tmp_path / "study.toml"
    assert runner.invoke(app, ["init", str(template)]).exit_code == 0
    demo = tmp_path / "demo.toml"
    demo.write_text(demo_study_text(1, 75.0))
    srm_lines = []
    for name, study in (("t", template), ("d", demo)):
        db = tmp_path / f"{name}.db"
        r = runner.invoke(app, ["enroll", "--study", str(study), "--db", str(db),
                                "--participant", "p01"])
        assert r.exit_code == 0 and "warning" not in r.output, r.output
        r = runner.invoke(app, ["status", "--db", str(db), "--json"])
        assert r.exit_code == 0, r.output
        st = json.loads(r.output)
        assert st["srm"] is None and st["assignments"] == {}
        srm_lines.append(st["srm_skipped"])
    assert srm_lines[0] == srm_lines[1]
    assert "no arms and no allocation ratio to check" in srm_lines[0]
    import sqlite3

    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("SELECT count(*) FROM arms").fetchone()[0] == 0  # none stored
        # as an older flowtrial stored the template's unused arms: not exported either
        conn.execute("INSERT INTO arms (name, delivery, weight, shaped, jitter) "
                     "VALUES ('fast', 'stream', 1, 1, 0)")
    r = runner.invoke(app, ["export", "--db", str(tmp_path / "t.db"), "--out",
                            str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    arms = pd.read_csv(tmp_path / "export" / "arms.csv")
    assert len(arms) == 0 and "name" in arms.columns
