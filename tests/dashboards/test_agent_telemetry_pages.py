"""Agent telemetry on the dashboard: the Arms page's tool decisions (person vs config) and the
Timeline's "agent waited for you", on a simulated study with agents' events added."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from flowtrial.study.schema import Event
from flowtrial.study.storage import WriteBatch, open_db, utcnow, write_rows
from tests.dashboards.test_pages import app, metric, render

NS = 1_000_000_000


@pytest.fixture
def agent_study(small_study: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    db = tmp_path / "agent.db"
    shutil.copy(small_study, db)
    database = open_db(db)
    try:
        with database.engine.connect() as conn:
            pid, arm = conn.execute(text(
                "SELECT participant_id, arm FROM cycles ORDER BY t_request_ns LIMIT 1")).one()
            cycles = conn.execute(text(
                "SELECT id, wall_anchor_ns + t_last_sent_ns - mono_anchor_ns FROM cycles "
                "WHERE participant_id = :p AND t_last_sent_ns IS NOT NULL "
                "ORDER BY t_request_ns LIMIT 3"), {"p": pid}).all()

        def ev(i: int, kind: str, after_s: float, duration_s: float | None = None,
               **payload: Any) -> dict[str, Any]:
            return {"participant_id": pid, "cycle_id": cycles[i][0], "kind": kind,
                    "ts_ns": int(cycles[i][1]) + round(after_s * NS),
                    "duration_s": duration_s, "source": "otel",
                    "payload_json": json.dumps({"agent": "codex", **payload}),
                    "dedupe_key": f"otel:t:{i}:{kind}", "received_at": utcnow()}

        write_rows(database, [WriteBatch(Event, [
            ev(0, "accept", 3.0, decided_by="person", source="User"),
            ev(0, "agent_wait", 0.5, 2.5),
            ev(1, "accept", 0.01, decided_by="config", source="Config"),
            ev(1, "tool_result", 1.0, 0.75),
            ev(2, "reject", 5.0, decided_by="person", source="User"),
        ])])
        scale = database.time_scale()
    finally:
        database.dispose()
    return db, {"pid": pid, "arm": arm, "scale": scale}


def test_arms_page_shows_tool_decisions_and_timeline_the_agent_wait(
        agent_study: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    db, info = agent_study
    at = app(db, monkeypatch)
    render(at, "pages/overview.py")
    render(at, "pages/arms.py")
    tables = {d.label for d in at.get("download_button")}
    assert any("agent tool decisions per arm" in t for t in tables), tables
    frame = next(df.value for df in at.dataframe if "by_person" in df.value.columns)
    row = frame[frame["arm"] == info["arm"]].iloc[0]
    assert (row["tool_decisions"], row["by_person"], row["by_config"]) == (3, 2, 1)
    assert row["person_acceptance_rate"] == "50.0 %"  # rates shown as the report prints them
    assert row["median_time_to_decide_s"] == pytest.approx(4.0 * info["scale"], rel=1e-6)
    assert row["cycles_agent_waited"] == 1
    # The same events per agent turn (each simulated cycle is a one-call turn).
    assert any("agent turns per arm" in t for t in tables), tables
    turns = next(df.value for df in at.dataframe if "turns_agent_waited" in df.value.columns)
    row = turns[turns["arm"] == info["arm"]].iloc[0]
    assert (row["turns"], row["decisions"], row["by_person"], row["turns_agent_waited"]) == (
        3, 3, 2, 1)

    render(at, "pages/timeline.py")
    at.selectbox(key="timeline_participant").set_value(info["pid"]).run()
    assert metric(at, "The agent waited for you") == f"{2.5 * info['scale']:.1f} s"
    assert "Agent turns with telemetry" in [h.value for h in at.subheader]
    day = next(df.value for df in at.dataframe if "agent_waited_s" in df.value.columns)
    assert len(day) == 3 and day["by_config"].sum() == 1
