"""Agent telemetry in the analysis: decisions by the person vs the agent's configuration, time to
decide, agent waits — per arm and wait band, in results.json and the HTML report; the cycle
table's decision is the person's only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from flowtrial.analysis.agent_telemetry import agent_section, read_agent_events
from flowtrial.analysis.metrics import cycle_table
from flowtrial.analysis.report import run_analysis
from flowtrial.study.schema import Event
from flowtrial.study.storage import WriteBatch, open_db, utcnow, write_rows
from tests.analysis.test_report import make_study

NS = 1_000_000_000


def _cycles(db: Path, n: int) -> list[Any]:
    """``n`` completed cycles of one arm, their simulated decisions removed (the agent's
    telemetry below is then all that decides them)."""
    database = open_db(db)
    try:
        with database.engine.begin() as conn:
            rows = conn.execute(text(
                "SELECT id, arm, participant_id, wall_anchor_ns + t_last_sent_ns - "
                "mono_anchor_ns FROM cycles WHERE status = 'ok' AND t_last_sent_ns IS NOT NULL "
                "ORDER BY arm, t_request_ns")).all()
            mine = [r for r in rows if r[1] == rows[0][1]][:n]
            for r in mine:
                conn.execute(text("DELETE FROM events WHERE cycle_id = :c AND kind IN "
                                  "('accept', 'reject', 'partial_accept')"), {"c": r[0]})
    finally:
        database.dispose()
    return mine


def _event(cycle: Any, kind: str, after_s: float, duration_s: float | None = None,
           **payload: Any) -> dict[str, Any]:
    return {"participant_id": cycle[2], "cycle_id": cycle[0], "kind": kind,
            "ts_ns": int(cycle[3]) + round(after_s * NS), "duration_s": duration_s,
            "source": "otel", "payload_json": json.dumps({"agent": "claude_code", **payload}),
            "dedupe_key": f"otel:test:{cycle[0]}:{kind}:{after_s}", "received_at": utcnow()}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    db = make_study(tmp_path_factory.mktemp("agent") / "study.db", design="parallel", n=4,
                    prompts=4, time_scale=1.0)
    mine = _cycles(db, 4)
    arm = mine[0][1]
    assert len(mine) == 4
    rows = [
        _event(mine[0], "accept", 2.0, decided_by="person", source="user_temporary"),
        _event(mine[0], "agent_wait", 0.1, 1.9),
        _event(mine[1], "reject", 4.0, decided_by="person", source="user_reject"),
        _event(mine[1], "agent_wait", 0.1, 3.9),
        _event(mine[2], "accept", 0.01, decided_by="config", source="config"),
        _event(mine[2], "tool_result", 0.5, 1.25),
        _event(mine[3], "partial_accept", 6.0, decided_by="person", source="gemini_cli"),
        _event(mine[3], "turn_start", -5.0),
    ]
    database = open_db(db)
    write_rows(database, [WriteBatch(Event, rows)])
    database.dispose()
    return db, {"arm": arm, "cycles": mine}


def test_cycle_decision_is_the_persons_only(study: tuple[Path, dict[str, Any]]) -> None:
    db, info = study
    database = open_db(db)
    try:
        table = cycle_table(database).set_index("cycle_id")
    finally:
        database.dispose()
    ids = [c[0] for c in info["cycles"]]
    assert list(table.loc[ids, "decision"]) == ["accept", "reject", "none", "partial"]
    assert table.loc[ids[0], "review_time_s"] == pytest.approx(2.0, abs=1e-6)
    assert table.loc[ids[1], "review_time_s"] == pytest.approx(4.0, abs=1e-6)


def test_report_has_agent_decisions_per_arm_and_band(study: tuple[Path, dict[str, Any]],
                                                     tmp_path: Path) -> None:
    db, info = study
    results = run_analysis(db, tmp_path / "rep", n_boot=10, workers=1, figures=False)
    section = results["agent_telemetry"]
    (row,) = [a for a in section["by_arm"] if a["arm"] == info["arm"]]
    assert (row["tool_decisions"], row["by_person"], row["by_config"]) == (4, 3, 1)
    assert row["person_acceptance_rate"] == pytest.approx(2 / 3)
    assert row["partial_rate"] == pytest.approx(1 / 3)
    assert row["time_to_decide_s_median"] == pytest.approx(4.0, abs=1e-6)
    assert row["cycles_agent_waited"] == 2
    assert row["agent_wait_s_median"] == pytest.approx(2.9)
    assert row["tool_time_s_total"] == pytest.approx(1.25) and row["turns"] == 1
    assert sum(b["tool_decisions"] for b in section["by_wait_band"]) == 4
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Agent tool decisions" in html and "person acceptance" in html


def test_no_agent_telemetry_no_section(tmp_path: Path) -> None:
    db = make_study(tmp_path / "plain.db", design="parallel", n=2, prompts=2, time_scale=1.0)
    database = open_db(db)
    try:
        events = read_agent_events(database)
        cycles = cycle_table(database)
    finally:
        database.dispose()
    assert events.empty
    assert agent_section(cycles, events, "idle_wait_s", [0.0, 1.0, float("inf")]) is None
