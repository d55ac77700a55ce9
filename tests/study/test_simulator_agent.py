"""Simulated agent turns (`--agent-steps K`): K calls per prompt, tool time between, the
person waiting for the whole turn; K = 1 is the chat simulation unchanged."""

from __future__ import annotations

import pandas as pd

from flowtrial.study.simulator.params import SimParams
from flowtrial.study.simulator.virtual import simulate_virtual_frames
from flowtrial.study.turns import Call, call_from_row, summarize_turn

from .conftest import make_config


def _frames(steps: int) -> dict[str, pd.DataFrame]:
    return simulate_virtual_frames(make_config(), SimParams(), 3, tasks=2, prompts_per_task=4,
                                   seed=11, agent_steps=steps)


def test_one_step_is_the_chat_simulation() -> None:
    a = simulate_virtual_frames(make_config(), SimParams(), 3, tasks=2, prompts_per_task=4,
                                seed=11)
    b = _frames(1)
    for name in ("cycles", "events", "tasks", "cycle_truth"):
        pd.testing.assert_frame_equal(a[name], b[name])
    assert set(a["cycles"]["request_kind"]) == {"human"}


def test_agent_turns_hold_k_calls_with_tool_time_and_turn_level_truth() -> None:
    chat, agent = _frames(1), _frames(5)
    cyc = agent["cycles"]
    assert len(cyc) == 5 * len(chat["cycles"])
    by_turn: dict[str, list[Call]] = {}
    for row in cyc.to_dict("records"):
        by_turn.setdefault(row["turn_id"], []).append(call_from_row(row))
    assert len(by_turn) == len(chat["cycles"])
    truth = agent["cycle_truth"].set_index("cycle_id")
    for tid, calls in by_turn.items():
        calls.sort(key=lambda c: c.t_request_ns)
        assert [c.kind for c in calls] == ["human"] + ["continuation"] * 4
        assert [c.tool_calls for c in calls] == [1, 1, 1, 1, 0]
        row = summarize_turn(tid, calls)
        assert row["status"] == "complete" and row["model_calls"] == 5
        final = row["last_cycle_id"]
        # The person's idle wait is the turn's: from the prompt to the answer's text.
        t = truth.loc[final]
        assert abs(row["tool_ms"] / 1000 - t["tool_s"]) < 1e-3  # raw ns rounding only
        assert t["idle_wait_s"] > t["tool_s"] and t["turn_calls"] == 5
    # The chat answers are the same; the turn makes the person wait (and switch) more.
    assert agent["cycle_truth"]["idle_wait_s"].mean() > chat["cycle_truth"]["idle_wait_s"].mean()
    assert agent["cycle_truth"]["p_switch"].mean() > chat["cycle_truth"]["p_switch"].mean()


def test_tool_calls_carry_the_timeline_the_proxy_records() -> None:
    """A simulated tool call reads like the proxy's record of one: held by the TTFT and its
    arguments paced at the rate the turn's answer experienced, counted in tokens_sent; the
    manipulation check then finds the tool calls on target (no more misses than chat)."""
    from flowtrial.analysis.manipulation import manipulation_check
    from flowtrial.study.simulator.agent import TOOL_CALL_TOKENS

    scale = make_config().study.time_scale
    chat, agent = _frames(1)["cycles"], _frames(5)["cycles"]
    tools = agent[agent["tool_calls"] == 1]
    final = agent[agent["tool_calls"] == 0].set_index("turn_id")
    assert len(tools) == 4 * len(final)
    assert (tools["tokens_sent"] == TOOL_CALL_TOKENS).all()
    assert (tools["violation_ms"] == 0).all()
    assert (tools["t_request_ns"] < tools["t_first_sent_ns"]).all()
    assert (tools["t_first_sent_ns"] < tools["t_last_sent_ns"]).all()
    same = final.loc[tools["turn_id"]]
    # The model's speed in this turn (raw ms and tokens/s, to the timestamps' ns rounding).
    assert (abs(tools["experienced_ttft_ms"].to_numpy()
                - same["experienced_ttft_ms"].to_numpy()) < 1e-5).all()
    assert (tools["experienced_ttft_ms"] >= tools["target_ttft_ms"]).all()
    achieved = tools["achieved_tps"].astype(float).to_numpy()
    assert (abs(achieved / same["achieved_tps"].astype(float).to_numpy() - 1) < 1e-4).all()
    misses = [sum(a["misses"] for a in manipulation_check(c, time_scale=scale).by_arm)
              for c in (chat, agent)]
    assert misses[1] == misses[0], misses


