"""Agent turns through the proxy with the official SDKs: every request classified (human,
continuation, side, retry) with its rule, one turn row per person's prompt holding the
model calls, the tool time between them and its side calls and retries, and the same rows
rebuilt from the cycles by the library function.

The simulated model runs with ``tool_steps = 2``: a request offering tools gets a tool
call for the first two steps of the turn, then the text answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from flowtrial.instrumentation.proxy import create_proxy_app
from flowtrial.study.turns import rebuild_turns
from tests.instrumentation.conftest import StudySetup
from tests.instrumentation.servers import run_asgi_server

MODEL = "flowtrial-sim-1"
TOOL_PAUSE_S = 0.05  # the "tool run" between a call and its continuation
_LS = {"name": "list_dir", "description": "List a directory",
       "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                      "required": ["path"]}}
_TURN_COLUMNS = ("participant_id, arm, protocol, client, conversation_key, t_start_ns, "
                 "t_end_ns, model_calls, side_calls, retries, tool_calls, wait_ms, model_ms, "
                 "injected_ms, tool_ms, gap_ms, status, first_cycle_id, last_cycle_id")


@pytest.fixture
def served(make_study) -> Iterator[tuple[StudySetup, str]]:
    s = make_study({"upstream": {"tool_steps": 2,
                                 "mock": {"tokens_per_second": 20000, "ttft_ms": 1}},
                    "arms": [{"name": "shaped", "ttft_ms": 30, "tokens_per_second": 2000}]})
    with run_asgi_server(create_proxy_app(s.database, s.config)) as url:
        yield s, url


def _cycles(s: StudySetup) -> list[Any]:
    return s.rows("SELECT id, request_kind, kind_rule, turn_id, client, tool_calls, "
                  "conversation_key FROM cycles ORDER BY t_request_ns")


def _turns(s: StudySetup, n_cycles: int) -> list[Any]:
    """The turn rows once the proxy has written them for all ``n_cycles`` (not awaited)."""
    deadline = time.monotonic() + 10
    while True:
        rows = s.rows(f"SELECT {_TURN_COLUMNS} FROM turns ORDER BY t_start_ns")
        counted = sum(r.model_calls + r.side_calls for r in rows)
        side_out = s.rows("SELECT count(*) FROM cycles WHERE turn_id IS NULL")[0][0]
        if counted + side_out >= n_cycles or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def _assert_rebuilt_identically(s: StudySetup, before: list[Any]) -> None:
    assert rebuild_turns(s.database) == len(before)
    after = s.rows(f"SELECT {_TURN_COLUMNS} FROM turns ORDER BY t_start_ns")
    assert [tuple(r) for r in after] == [tuple(r) for r in before]


def _agent_turn_asserts(s: StudySetup, kinds: list[tuple[str, str]]) -> Any:
    rows = _cycles(s)
    assert [(r.request_kind, r.kind_rule) for r in rows] == kinds, rows
    turns = _turns(s, len(rows))
    assert len(turns) == 1, turns
    t = turns[0]
    assert t.status == "complete" and t.model_calls == 4 and t.retries == 1
    assert t.side_calls == 1 and t.tool_calls == 2
    # Two tool runs of >= TOOL_PAUSE_S each; the arm's 30 ms TTFT on each of 4 calls.
    assert t.tool_ms >= 2 * TOOL_PAUSE_S * 1000
    assert t.model_ms >= 4 * 30 and t.injected_ms > 0
    assert t.wait_ms == pytest.approx(t.model_ms + t.tool_ms + t.gap_ms, abs=0.01)
    assert {r.turn_id for r in rows} == {"trn_" + rows[0].id.removeprefix("cyc_")}
    assert rows[0].client == "openai/python" or rows[0].client == "anthropic/python"
    _assert_rebuilt_identically(s, turns)
    return t


def test_chat_completions_turn_with_side_call_and_retry(served) -> None:
    s, url = served
    c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
    tools = [{"type": "function", "function": _LS}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "What is in this folder?"}]
    for step in range(3):
        r = c.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        msg = r.choices[0].message
        if not msg.tool_calls:
            break
        call = msg.tool_calls[0]
        assert call.function.name == "list_dir" and json.loads(call.function.arguments) == {
            "path": "."} and r.choices[0].finish_reason == "tool_calls"
        if step == 0:  # a title call while the turn waits for its tool
            title = c.chat.completions.create(model=MODEL, messages=[
                {"role": "system", "content": "Write a short title."},
                {"role": "user", "content": "What is in this folder?"}])
            assert title.choices[0].message.content
        time.sleep(TOOL_PAUSE_S)
        messages += [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "a.py b.py"}]
    assert step == 2 and msg.content
    again = c.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert again.choices[0].message.content == msg.content
    _agent_turn_asserts(s, [
        ("human", "new_input"), ("side", "other_conversation_while_open"),
        ("continuation", "tool_output:chat:tool_message"),
        ("continuation", "tool_output:chat:tool_message"), ("retry", "identical_request")])


def test_messages_turn_with_side_call_and_retry(served) -> None:
    s, url = served
    c = anthropic.Anthropic(base_url=url, api_key=s.key, max_retries=0)
    tools = [{"name": "LS", "description": "List files",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                               "required": ["path"]}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this folder?"}]}]
    for step in range(3):
        with c.messages.stream(model=MODEL, max_tokens=200, system="You are an agent.",
                               messages=messages, tools=tools) as stream:
            final = stream.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        if not uses:
            break
        assert final.stop_reason == "tool_use" and uses[0].name == "LS"
        assert uses[0].input == {"path": "."}
        if step == 1:  # a side call to another, smaller model, without tools
            c.messages.create(model="flowtrial-sim-1-mini", max_tokens=50, system="Title it.",
                              messages=[{"role": "user", "content": "folder listing"}])
        time.sleep(TOOL_PAUSE_S)
        messages += [{"role": "assistant", "content": [b.model_dump() for b in final.content]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": uses[0].id,
                          "content": "a.py b.py"},
                         {"type": "text", "text": "<system-reminder>ok</system-reminder>"}]}]
    assert step == 2 and final.content[0].type == "text"
    # The client re-asks the last request (its stream broke, say): the same body again.
    with c.messages.stream(model=MODEL, max_tokens=200, system="You are an agent.",
                           messages=messages, tools=tools) as stream:
        stream.get_final_message()
    _agent_turn_asserts(s, [
        ("human", "new_input"), ("continuation", "tool_output:messages:tool_result"),
        ("side", "other_conversation_while_open"),
        ("continuation", "tool_output:messages:tool_result"), ("retry", "identical_request")])


def test_responses_chain_by_previous_response_id(served) -> None:
    """Codex-style chaining: after the first request, only the tool outputs are sent, with
    previous_response_id; the chain keeps its conversation and its turn."""
    s, url = served
    c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
    tools = [{"type": "function", **_LS}]
    r = c.responses.create(model=MODEL, instructions="You are an agent.", tools=tools,
                           input=[{"role": "user", "content": "What is in this folder?"}])
    for _ in range(3):
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            break
        assert calls[0].name == "list_dir"
        time.sleep(TOOL_PAUSE_S)
        r = c.responses.create(model=MODEL, tools=tools, previous_response_id=r.id, input=[
            {"type": "function_call_output", "call_id": calls[0].call_id,
             "output": "a.py b.py"}])
    assert r.output_text
    # A side call: structured output (a title), no tools, after the turn ended.
    c.responses.create(model=MODEL, input="Title: folder listing", text={"format": {
        "type": "json_schema", "name": "t", "schema": {
            "type": "object", "properties": {"title": {"type": "string"}}}}})
    # The person's next prompt, from a chat client (streamed): a new single-call turn.
    chat = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0,
                         default_headers={"User-Agent": "my-chat/1.0"})
    with chat.responses.stream(model=MODEL, input="Thanks! And now?") as stream:
        stream.get_final_response()
    rows = _cycles(s)
    assert [(r.request_kind, r.kind_rule) for r in rows] == [
        ("human", "new_input"),
        ("continuation", "tool_output:responses:previous_response_tool_output"),
        ("continuation", "tool_output:responses:previous_response_tool_output"),
        ("side", "structured_without_tools"), ("human", "new_input")], rows
    assert len({r.conversation_key for r in rows[:3]}) == 1
    assert [r.client for r in rows] == ["openai/python"] * 4 + ["my-chat"]
    turns = _turns(s, len(rows))
    assert [(t.model_calls, t.tool_calls, t.side_calls, t.status) for t in turns] == [
        (3, 2, 0, "complete"), (1, 0, 0, "complete")]
    assert turns[0].tool_ms >= 2 * TOOL_PAUSE_S * 1000 and turns[1].tool_ms == 0
    _assert_rebuilt_identically(s, turns)


def test_completions_are_single_call_human_turns(served) -> None:
    s, url = served
    c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
    for prompt in ("def add(a, b):", "def add(a, b):"):
        c.completions.create(model=MODEL, prompt=prompt, max_tokens=8)
    rows = _cycles(s)
    # Identical FIM requests are both the person's: completions are never retries.
    assert [(r.request_kind, r.kind_rule) for r in rows] == [("human", "completions")] * 2
    turns = _turns(s, 2)
    assert [(t.model_calls, t.tool_ms, t.status) for t in turns] == [(1, 0, "complete")] * 2
    assert all(t.wait_ms == pytest.approx(t.model_ms) for t in turns)
    _assert_rebuilt_identically(s, turns)
