"""Withdrawal and deletion on SQLite and PostgreSQL: every row of the participant in every
table goes in one transaction, the other participant's stay, the audit names no content, and
exports afterwards hold nothing of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.export import export_tables
from flowtrial.study.participation import deletion_counts, withdraw
from flowtrial.study.schema import TABLES, DrawCounter, Event, GroundTruth, Persistence
from flowtrial.study.storage import WriteBatch, utcnow, write_rows
from flowtrial.study.tasks import add_task
from tests.capture.conftest import NS, T0_NS

pytestmark = pytest.mark.both_backends


def _fill(study: Any, pid: str) -> None:
    for i in range(3):
        study.add_cycle(f"cyc_{pid}_{i}", pid, T0_NS + i * 60 * NS, T0_NS + i * 60 * NS + NS,
                        content=f"secret answer {pid} {i}", prompt=f"secret prompt {pid}",
                        keep_text=True)
    add_task(study.database, pid, f"task of {pid}", description="secret description")
    write_rows(study.database, [
        WriteBatch(Event, [{"participant_id": pid, "cycle_id": f"cyc_{pid}_0", "kind": "accept",
                            "ts_ns": T0_NS + NS, "source": "client", "received_at": utcnow(),
                            "payload_json": json.dumps({"title": "secret title"}),
                            "dedupe_key": f"k-{pid}"}]),
        WriteBatch(Persistence, [{"cycle_id": f"cyc_{pid}_0", "interval_s": 30.0,
                                  "score": 1.0, "persisted": True,
                                  "checked_against": f"cyc_{pid}_1"}]),
        WriteBatch(GroundTruth, [{"scope": "participant", "participant_id": pid,
                                  "truth_model": "t", "params_json": "{}"}]),
        WriteBatch(DrawCounter, [{"participant_id": pid, "next_index": 7}]),
    ])


def _holding(study: Any, pid: str) -> dict[str, int]:
    out = {}
    for model in TABLES:
        t = model.__table__  # type: ignore[attr-defined]
        if "participant_id" in t.c and t.name != "audit":
            out[t.name] = study.rows(f"SELECT count(*) FROM {t.name} WHERE participant_id = :p",
                                     p=pid)[0][0]
    out["participants"] = study.rows("SELECT count(*) FROM participants WHERE id = :p",
                                     p=pid)[0][0]
    return out


def test_withdraw_then_delete(make_study: Any, tmp_path: Path) -> None:
    study = make_study(participants=("p01", "p02"))
    for pid in ("p01", "p02"):
        _fill(study, pid)
    before = _holding(study, "p02")
    # Withdrawal alone keeps the data and stops recording (withdrawn_at).
    assert withdraw(study.database, "p01") == {}
    assert study.rows("SELECT withdrawn_at FROM participants WHERE id='p01'")[0][0] is not None
    assert _holding(study, "p01")["cycles"] == 3
    status = CliRunner().invoke(app, ["status", "--db", str(study.db), "--json"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["withdrawn"] == 1
    out = CliRunner().invoke(app, ["withdraw", "--db", str(study.db), "--participant", "p01",
                                   "--delete"])
    assert out.exit_code == 0, out.output
    assert "Deleted 10 rows" in out.output
    assert set(_holding(study, "p01").values()) == {0}
    assert study.rows("SELECT count(*) FROM persistence WHERE cycle_id LIKE 'cyc_p01%'"
                      )[0][0] == 0
    assert _holding(study, "p02") == before  # the other participant untouched
    audit = study.rows("SELECT action, participant_id, detail_json FROM audit ORDER BY id")
    assert [(a, p) for a, p, _ in audit] == [("withdraw", "p01"), ("delete", "p01")]
    assert json.loads(audit[1][2])["rows"] == {
        "assignments": 1, "cycles": 3, "draw_counters": 1, "events": 1, "ground_truth": 1,
        "participants": 1, "persistence": 1, "tasks": 1}
    assert "secret" not in audit[1][2]
    for deid in (False, True):
        out_dir = tmp_path / f"export-{deid}"
        counts = export_tables(study.database, out_dir, deidentify=deid)
        assert counts["participants"] == 1 and counts["cycles"] == 3
        assert counts["persistence"] == 1 and counts["ground_truth"] == 1
        for f in out_dir.glob("*.csv"):
            text = f.read_text(encoding="utf-8")
            assert "p01" not in text, f.name
        assert pd.read_csv(out_dir / "events.csv").shape[0] == 1
    again = CliRunner().invoke(app, ["withdraw", "--db", str(study.db), "--participant",
                                     "p01", "--delete"])
    assert again.exit_code == 2 and "not enrolled" in again.output


def test_deletion_is_one_transaction(make_study: Any) -> None:
    study = make_study(participants=("p01",))
    _fill(study, "p01")
    with pytest.raises(RuntimeError), study.database.engine.begin() as conn:
        assert deletion_counts(conn, "p01")["cycles"] == 3
        raise RuntimeError("a failure after the deletes")
    assert _holding(study, "p01")["cycles"] == 3 and _holding(study, "p01")["participants"] == 1
