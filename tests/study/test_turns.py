"""Turns from cycles: the turn row's arithmetic, kinds inferred for older data, and
`rebuild_turns` / `flowtrial turns` on a database written before turns existed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.storage import open_db
from flowtrial.study.turns import Call, TurnAssigner, infer_kinds, rebuild_turns, summarize_turn

DATA = Path(__file__).parent / "data"
MS = 1_000_000


def call(cid: str, kind: str, start_ms: float, end_ms: float | None, tools: int = 0,
         **kw: object) -> Call:
    return Call(cycle_id=cid, participant_id="p", kind=kind, t_request_ns=int(start_ms * MS),
                t_end_ns=None if end_ms is None else int(end_ms * MS), tool_calls=tools,
                t_last_sent_ns=None if tools or end_ms is None else int(end_ms * MS),
                **kw)  # type: ignore[arg-type]


def test_turn_row_splits_the_wait_into_model_tool_and_gap() -> None:
    calls = [
        call("c1", "human", 0, 100, tools=1),
        call("c2", "continuation", 150, 250, tools=1),  # 50 ms of tool time before it
        call("s1", "side", 160, 400),  # a title call: counted, not waited for
        call("c3", "continuation", 330, 500, shaped=True, t_upstream_last_ns=420 * MS),
    ]
    row = summarize_turn("trn_1", calls)
    assert row["status"] == "complete" and row["last_cycle_id"] == "c3"
    assert (row["model_calls"], row["side_calls"], row["tool_calls"]) == (3, 1, 2)
    assert row["wait_ms"] == 500 and row["model_ms"] == 100 + 100 + 170
    assert row["tool_ms"] == 50 + 80 and row["gap_ms"] == 0
    assert row["injected_ms"] == 80  # the final answer's text went out 80 ms after upstream
    # A turn whose last call failed is an error turn that ends at that call.
    failed = summarize_turn("trn_2", [call("c1", "human", 0, 100, tools=1),
                                      call("c2", "continuation", 150, 160, status="error")])
    assert failed["status"] == "error" and failed["wait_ms"] == 160


def test_overlapping_calls_count_model_time_once_and_cross_processes() -> None:
    # c2 was recorded by another process whose monotonic clock is 1 s ahead.
    calls = [call("c1", "human", 0, 100, tools=1),
             Call("c2", "p", "retry", 1050 * MS, 1200 * MS, offset_ns=-1000 * MS)]
    row = summarize_turn("t", calls)
    assert row["model_ms"] == 200 and row["wait_ms"] == 200 and row["retries"] == 1


def test_assigner_joins_continuations_and_retries_to_their_turn() -> None:
    a = TurnAssigner()
    t1 = a.assign("p", "cyc_1", "human", 0, conversation_key="k", request_key="r1")
    assert t1 == "trn_1"
    assert a.assign("p", "cyc_2", "side", 1, conversation_key="x") == t1
    assert a.assign("p", "cyc_3", "continuation", 2, conversation_key="k") == t1
    a.ended("p", t1, "continuation", True, 3)  # final answer: the turn is closed
    assert a.assign("p", "cyc_4", "side", 4) is None  # nothing open
    assert a.assign("p", "cyc_5", "retry", 5, request_key="r1") == t1  # re-asked
    assert a.assign("p", "cyc_6", "human", 6, conversation_key="k") == "trn_6"
    # A continuation long after anything it could join starts a turn of its own.
    far = int(10_000 * 1e9)
    assert a.assign("p", "cyc_7", "continuation", far, conversation_key="k") == "trn_7"


def test_infer_kinds_for_cycles_without_one() -> None:
    calls = [call("a", "human", 0, 100, tools=1), call("b", "human", 150, 300),
             call("c", "human", 400, 500, protocol="completions"),
             call("d", "human", 600, 700)]
    assert infer_kinds(calls) == {"a": ("human", "inferred:default"),
                                  "b": ("continuation", "inferred:after_tool_call"),
                                  "c": ("human", "inferred:completions"),
                                  "d": ("human", "inferred:default")}


def test_database_from_before_turns_gets_turns(tmp_path: Path) -> None:
    """The 0.1 database (40 chat cycles, no kinds): one single-call human turn per cycle,
    its wait the cycle's generation wait; the command rebuilds the same rows again."""
    db = tmp_path / "old.db"
    shutil.copy(DATA / "v1_study.db", db)
    database = open_db(db)
    try:
        assert rebuild_turns(database) == 40
        with database.engine.connect() as conn:
            kinds = conn.execute(text("SELECT DISTINCT request_kind, kind_rule FROM cycles"))
            assert kinds.all() == [("human", "inferred:default")]
            pairs = conn.execute(text(
                "SELECT t.wait_ms, c.generation_wait_ms, t.model_calls, t.tool_ms, t.status "
                "FROM turns t JOIN cycles c ON c.turn_id = t.id")).all()
        assert len(pairs) == 40
        for wait, gen_wait, n, tool, status in pairs:
            assert n == 1 and tool == 0 and wait == pytest.approx(gen_wait)
            assert status == "complete"
        before = _turn_rows(database)
    finally:
        database.dispose()
    result = CliRunner().invoke(app, ["turns", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "40 turns" in result.output
    database = open_db(db)
    try:
        assert _turn_rows(database) == before
    finally:
        database.dispose()


def _turn_rows(database: object) -> list[tuple[object, ...]]:
    with database.engine.connect() as conn:  # type: ignore[attr-defined]
        return [tuple(r) for r in conn.execute(text(
            "SELECT id, t_start_ns, t_end_ns, wait_ms, model_ms FROM turns ORDER BY id"))]
