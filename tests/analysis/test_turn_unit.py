"""The unit of waiting: agent turns where they have several calls or side calls exist, the
cycle otherwise (a chat-only study's numbers do not change)."""

from __future__ import annotations

import pandas as pd
import pytest

from flowtrial.analysis.metrics import cycle_table_from_frames, frames_from_tables
from flowtrial.analysis.turns import waiting_units
from flowtrial.study.config import parse_study

S = 1_000_000_000
CONFIG = parse_study({"study": {"name": "t", "design": "parallel"}, "arms": [{"name": "a"}]})


def _cycle(cid: str, kind: str, turn: str | None, req_s: float, first_s: float | None,
           last_s: float | None, tokens: int = 100, tools: int = 0) -> dict[str, object]:
    ns = lambda x: None if x is None else int(x * S)  # noqa: E731
    return {"id": cid, "participant_id": "p1", "arm": "a", "period": 0, "task_id": 1,
            "protocol": "messages", "status": "ok", "started_at": "2026-01-01T00:00:00Z",
            "mono_anchor_ns": 0, "wall_anchor_ns": 1_700_000_000 * S,
            "t_request_ns": ns(req_s), "t_first_sent_ns": ns(first_s),
            "t_last_sent_ns": ns(last_s), "target_ttft_ms": 300.0, "target_tps": 50.0,
            "target_delivery": "stream",
            "experienced_ttft_ms": None if first_s is None else (first_s - req_s) * 1000,
            "achieved_tps": 50.0 if first_s is not None else None, "violation": False,
            "violation_ms": 0.0, "tokens_completion": tokens, "tokens_sent": tokens,
            "request_kind": kind, "turn_id": turn, "tool_calls": tools}


AGENT = [
    _cycle("c1", "human", "t1", 0.0, None, None, 20, tools=1),
    _cycle("s1", "side", "t1", 0.5, 0.8, 1.0, 10),
    _cycle("c2", "continuation", "t1", 3.0, None, None, 20, tools=1),
    _cycle("c3", "continuation", "t1", 6.0, 6.3, 8.3),
    _cycle("c4", "human", "t4", 30.0, 30.3, 32.3),
]


def test_agent_turns_become_the_unit() -> None:
    units, unit = waiting_units(pd.DataFrame(AGENT))
    assert (unit.unit, unit.units, unit.side_calls, unit.multi_call_turns) == ("turn", 2, 1, 1)
    assert "1 side calls set aside" in unit.sentence()
    table = cycle_table_from_frames(frames_from_tables({"cycles": pd.DataFrame(AGENT)}, CONFIG))
    assert table.attrs["wait_unit"]["unit"] == "turn"
    assert list(table["cycle_id"]) == ["c3", "c4"]  # the final answers
    turn = table.iloc[0]
    # The turn's wait runs from the person's prompt (0 s) to the answer's text (6.3 s).
    assert turn["experienced_ttft_s"] == pytest.approx(6.3)
    assert turn["total_wait_s"] == pytest.approx(8.3)
    assert turn["idle_wait_s"] >= 6.3
    assert table.iloc[1]["experienced_ttft_s"] == pytest.approx(0.3)


def test_chat_only_studies_keep_their_cycles() -> None:
    chat = [_cycle(f"c{i}", "human", f"t{i}", 10.0 * i, 10.0 * i + 0.3, 10.0 * i + 2)
            for i in range(4)]
    df = pd.DataFrame(chat)
    same, unit = waiting_units(df)
    assert same is df and unit.unit == "cycle" and unit.units == 4
    without = df.drop(columns=["request_kind", "turn_id"])
    a = cycle_table_from_frames(frames_from_tables({"cycles": df}, CONFIG))
    b = cycle_table_from_frames(frames_from_tables({"cycles": without}, CONFIG))
    pd.testing.assert_frame_equal(a, b)


def test_turn_segments_draw_calls_and_tool_runs_inside_the_turn() -> None:
    from flowtrial.analysis.turns import turn_segments

    rows = [dict(r, t_done_ns=(r["t_last_sent_ns"] or int((r["t_request_ns"] / S + 0.4) * S)))
            for r in AGENT]
    seg = turn_segments(pd.DataFrame(rows))
    assert list(seg["phase"]) == ["model call"] * 3 + ["tool"] * 2
    assert set(seg["cycle_id"]) == {"c3"}  # drawn on the turn's row (its final answer)
    tool = seg[seg["phase"] == "tool"]
    secs = ((tool["end"] - tool["start"]).dt.total_seconds()).round(3).tolist()
    assert secs == [2.6, 2.6]  # 0.4 → 3.0 and 3.4 → 6.0
