"""`flowtrial export --release`: a Frictionless data package of the analysis tables that
validates with the frictionless library, carries its codebook, version and configuration
hash, and holds no raw identifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from flowtrial.analysis.codebook import CODEBOOK, CodebookError, field_for
from flowtrial.analysis.metrics import cycle_table
from flowtrial.cli import app
from flowtrial.study.storage import open_db
from tests.analysis.test_report import make_study

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("release")
    db = make_study(d / "study.db", design="parallel", n=6, prompts=4, time_scale=1.0)
    database = open_db(db)
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET post_review_s = 600, outcome = 'failed_review', "
                          "link = 'https://github.com/acme/secret-repo/pull/7' WHERE id = 1"))
    database.dispose()
    out = CliRunner().invoke(app, ["export", "--db", str(db), "--release", str(d / "pkg")])
    assert out.exit_code == 0, out.output
    return db, d / "pkg"


def test_package_validates_with_frictionless(released: tuple[Path, Path]) -> None:
    frictionless = pytest.importorskip("frictionless")
    _, pkg = released
    report = frictionless.Package(str(pkg / "datapackage.json")).validate()
    assert report.valid, report.flatten(["rowNumber", "fieldName", "type", "note"])[:5]
    # A broken cell is caught: the validation is real.
    cycles = (pkg / "cycles.csv").read_text(encoding="utf-8").splitlines()
    head = cycles[0].split(",")
    row = cycles[1].split(",")
    row[head.index("total_wait_s")] = "slow"
    broken = pkg.parent / "broken"
    broken.mkdir(exist_ok=True)
    for f in pkg.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "cycles.csv").write_text("\n".join([cycles[0], ",".join(row), *cycles[2:]])
                                       + "\n", encoding="utf-8")
    assert not frictionless.Package(str(broken / "datapackage.json")).validate().valid


def test_codebook_version_hash_and_tables(released: tuple[Path, Path]) -> None:
    db, pkg = released
    meta = json.loads((pkg / "datapackage.json").read_text(encoding="utf-8"))
    database = open_db(db)
    config = database.config()
    cycles = cycle_table(database)
    raw_ids = {r[0] for r in database.engine.connect().execute(
        text("SELECT id FROM participants"))}
    database.dispose()
    assert meta["config_hash"] == config.config_hash() and len(meta["config_hash"]) == 64
    assert meta["flowtrial_version"]
    assert {r["name"] for r in meta["resources"]} == set(CODEBOOK)
    for r in meta["resources"]:
        for f in r["schema"]["fields"]:
            assert f["type"] in {"string", "integer", "number", "boolean", "datetime"}
            assert f["description"]
        with_unit = {f["name"]: f.get("unit") for f in r["schema"]["fields"]}
        if r["name"] == "cycles":
            assert with_unit["total_wait_s"] == "s" and with_unit["target_tps"] == "tokens/s"
    # The tables the report uses, de-identified.
    rel = pd.read_csv(pkg / "cycles.csv")
    assert len(rel) == len(cycles)
    assert sorted(rel["total_wait_s"].round(9)) == sorted(cycles["total_wait_s"].round(9))
    tasks = pd.read_csv(pkg / "tasks.csv")
    assert "name" not in tasks.columns and "link" not in tasks.columns
    assert (tasks["outcome"] == "failed_review").sum() == 1
    assert tasks["post_review_s"].max() == 600
    everything = "".join(f.read_text(encoding="utf-8") for f in pkg.iterdir())
    assert not any(pid in everything for pid in raw_ids)
    assert "secret-repo" not in everything
    assert set(pd.read_csv(pkg / "turns.csv")["participant_id"]) == set(rel["participant_id"])
    assert meta["config_hash"] in (pkg / "README.md").read_text(encoding="utf-8")


def test_codebook_covers_columns_and_the_docs_page_is_current() -> None:
    assert field_for("cycles", "switched_45s").type == "boolean"
    assert field_for("cycles", "persisted_120s").type == "boolean"
    with pytest.raises(CodebookError, match="no codebook entry"):
        field_for("cycles", "a_new_column")
    pytest.importorskip("cogapp")
    proc = subprocess.run([sys.executable, "-m", "cogapp", "--check", "--diff",
                           "docs/reference/codebook.md"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, ("docs/reference/codebook.md is stale: run "
                                  f"`cog -r docs/reference/codebook.md`\n{proc.stdout}")
