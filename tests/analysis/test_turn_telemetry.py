"""Agent telemetry tied to agent turns (``flowtrial.analysis.turn_telemetry``): through the
event's cycle, else by participant and time; per-turn tables and the report's section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import text

from flowtrial.analysis.report import run_analysis
from flowtrial.analysis.turn_telemetry import (
    events_by_turn,
    read_turn_inputs,
    turn_section,
    turn_table,
)
from flowtrial.study.schema import Event
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.storage import WriteBatch, init_db, open_db, utcnow, write_rows
from tests.analysis.test_report import config_for

S = 1_000_000_000
T0 = 1_700_000_000 * S

TURNS = pd.DataFrame([
    # t1: prompt at 0 s; calls c1 (tool call, ends 1 s), c2 (final, 4 → 5 s)
    {"turn_id": "trn_1", "participant_id": "p1", "arm": "slow", "client": "claude-cli",
     "start_ns": T0 + 1 * S // 10, "end_ns": T0 + 5 * S, "model_calls": 2, "wait_ms": 4900.0,
     "model_ms": 1900.0, "tool_ms": 3000.0, "status": "complete", "first_cycle_id": "cyc_1"},
    # t2 starts at 60 s
    {"turn_id": "trn_3", "participant_id": "p1", "arm": "slow", "client": "claude-cli",
     "start_ns": T0 + 60 * S, "end_ns": T0 + 62 * S, "model_calls": 1, "wait_ms": 2000.0,
     "model_ms": 2000.0, "tool_ms": 0.0, "status": "complete", "first_cycle_id": "cyc_3"},
])
CYCLES = pd.DataFrame([
    {"cycle_id": "cyc_1", "participant_id": "p1", "turn_id": "trn_1",
     "request_kind": "human", "request_ns": T0 + S // 10, "end_ns": T0 + 1 * S},
    {"cycle_id": "cyc_2", "participant_id": "p1", "turn_id": "trn_1",
     "request_kind": "continuation", "request_ns": T0 + 4 * S, "end_ns": T0 + 5 * S},
    # a title call sent after the second prompt, joined to the turn open then (trn_1)
    {"cycle_id": "cyc_s", "participant_id": "p1", "turn_id": "trn_1",
     "request_kind": "side", "request_ns": T0 + 59 * S, "end_ns": T0 + 59 * S + S // 2},
    {"cycle_id": "cyc_3", "participant_id": "p1", "turn_id": "trn_3",
     "request_kind": "human", "request_ns": T0 + 60 * S, "end_ns": T0 + 62 * S},
])


def _ev(i: int, kind: str, at_s: float, cycle: str | None = None,
        duration_s: float | None = None, by: str | None = None) -> dict[str, Any]:
    return {"event_id": i, "participant_id": "p1", "cycle_id": cycle, "kind": kind,
            "ts_ns": T0 + round(at_s * S), "duration_s": duration_s, "decided_by": by,
            "agent": "claude_code", "span": False}


EVENTS = pd.DataFrame([
    _ev(1, "turn_start", 0.0, "cyc_1"),
    _ev(2, "api_request", 1.0, "cyc_1", 0.9),
    _ev(3, "agent_wait", 1.1, "cyc_1", 2.0),
    _ev(4, "accept", 3.1, "cyc_1", by="person"),  # 2.1 s after the answer's end
    _ev(5, "tool_result", 3.9, None, 0.8),  # no cycle: by time, inside trn_1
    _ev(6, "reject", 5.5, None, by="person"),  # after trn_1's last token: still trn_1
    _ev(7, "accept", 5.6, None, by="config"),
    # the second prompt came before the title call and was linked to it
    _ev(8, "turn_start", 58.0, "cyc_s"),
    _ev(9, "api_request", 62.0, "cyc_3", 2.0),
    _ev(10, "tool_result", 62.0 + 7200, None, 1.0),  # hours later: no turn
    _ev(11, "turn_start", 500.0, None),  # a prompt no request followed: no turn
])


def test_events_find_their_turn_through_the_cycle_else_by_time() -> None:
    linked = events_by_turn(EVENTS, TURNS, CYCLES).set_index("event_id")
    assert linked.loc[[1, 2, 3, 4], "turn_id"].tolist() == ["trn_1"] * 4
    assert set(linked.loc[[1, 2, 3, 4], "turn_link"]) == {"cycle"}
    assert linked.loc[[5, 6, 7], "turn_id"].tolist() == ["trn_1"] * 3
    assert set(linked.loc[[5, 6, 7], "turn_link"]) == {"time"}
    # The prompt linked to a side call belongs to the turn it started, not the side call's.
    assert (linked.loc[8, "turn_id"], linked.loc[8, "turn_link"]) == ("trn_3", "time")
    assert linked.loc[9, "turn_id"] == "trn_3"
    assert linked.loc[[10, 11], "turn_id"].isna().all()


def test_turn_table_sets_the_agents_account_beside_the_proxys() -> None:
    table = turn_table(events_by_turn(EVENTS, TURNS, CYCLES), TURNS, CYCLES, scale=2.0)
    t1 = table.set_index("turn_id").loc["trn_1"]
    assert (t1["prompts"], t1["decisions"], t1["by_person"], t1["by_config"]) == (1, 3, 2, 1)
    assert (t1["person_accepts"], t1["person_rejects"]) == (1, 1)
    # × time_scale: the proxy's tool time 3 s, the agent's tool 0.8 s, it waited 2 s
    assert t1["proxy_tool_s"] == pytest.approx(6.0)
    assert t1["agent_tool_s"] == pytest.approx(1.6)
    assert t1["agent_waited_s"] == pytest.approx(4.0)
    # the person's decisions: 2.1 s after c1's end, 0.5 s after c2's end → median 1.3 s
    assert t1["time_to_decide_s"] == pytest.approx(2 * 1.3)
    assert t1["prompt_to_request_s"] == pytest.approx(0.2)
    assert (t1["linked_by_cycle"], t1["linked_by_time"]) == (4, 3)
    section = turn_section(table, [0.0, 4.0, float("inf")], total_turns=5)
    assert section is not None and section["turns_total"] == 5
    (arm,) = section["by_arm"]
    assert (arm["turns"], arm["turns_with_decisions"], arm["turns_agent_waited"]) == (2, 1, 1)
    assert arm["person_acceptance_rate"] == pytest.approx(0.5)
    assert [b["turns"] for b in section["by_model_time_band"]] == [1, 1]  # 3.8 s, 4 s
    assert turn_section(table.iloc[0:0], [0.0, 1.0], 0) is None


@pytest.fixture(scope="module")
def agent_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """A simulated agent study (3 calls a turn), with Claude Code telemetry on two turns."""
    path = tmp_path_factory.mktemp("agt") / "study.db"
    cfg = config_for("parallel", 1.0)
    db = init_db(path, cfg)
    simulate_virtual(db, cfg, SimParams(), 4, tasks=2, prompts_per_task=4, seed=5,
                     agent_steps=3)
    with db.engine.connect() as conn:
        turns = conn.execute(text(
            "SELECT t.id, t.participant_id, t.arm, t.first_cycle_id, t.last_cycle_id, "
            "t.wall_anchor_ns + t.t_start_ns - t.mono_anchor_ns FROM turns t "
            "ORDER BY t.participant_id, t.t_start_ns LIMIT 2")).all()
    rows = []
    for n, (tid, pid, _arm, first, _last, start) in enumerate(turns):
        def ev(kind: str, at: int, cycle: str | None, dur: float | None = None,
               tid: str = tid, pid: str = pid, **p: Any) -> dict[str, Any]:
            return {"participant_id": pid, "cycle_id": cycle, "kind": kind, "ts_ns": at,
                    "duration_s": dur, "source": "otel", "received_at": utcnow(),
                    "payload_json": json.dumps({"agent": "claude_code", **p}),
                    "dedupe_key": f"otel:test:{tid}:{kind}"}
        rows += [ev("turn_start", int(start) - S // 10, first),
                 ev("reject" if n else "accept", int(start) + S // 2, None,
                    decided_by="person", source="user_reject" if n else "user_temporary"),
                 ev("agent_wait", int(start) + S // 2, None, 1.5)]
    write_rows(db, [WriteBatch(Event, rows)])
    db.dispose()
    return path, turns


def test_report_shows_turns_with_telemetry(agent_study: tuple[Path, list[Any]],
                                           tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, turns = agent_study
    database = open_db(path)
    try:
        ev, tt, cc = read_turn_inputs(database, [turns[0][1]])
    finally:
        database.dispose()
    assert set(tt["participant_id"]) == {turns[0][1]} and len(ev) == 6
    results = run_analysis(path, tmp_path / "rep", n_boot=10, workers=1, figures=False)
    section = results["agent_turns"]
    assert section["overall"]["turns"] == 2
    assert section["overall"]["by_person"] == 2
    assert section["overall"]["person_acceptance_rate"] == pytest.approx(0.5)
    assert section["overall"]["turns_agent_waited"] == 2
    assert {t["turn_id"] for t in section["turns"]} == {t[0] for t in turns}
    assert section["turns_total"] > 2
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Agent turns with telemetry" in html and turns[0][0] in html
    # `flowtrial analyze` says turns where it waited on turns, and from how many calls.
    st = results["study"]
    assert st["wait_unit"] == "turn" and st["n_model_calls"] == 3 * st["n_cycles"]
    from flowtrial.analysis.report_commands import _print_summary

    _print_summary(results, tmp_path / "rep")
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"turns={st['n_cycles']} (of {st['n_model_calls']} model calls)" in printed
    assert "cycles=" not in printed
    assert f"{st['n_cycles']} turns" in " ".join(html.split())
