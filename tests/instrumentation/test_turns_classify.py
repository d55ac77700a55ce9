"""The classification rules one by one (pure: request body + context in, kind + rule out),
the client name, and the simulated model's tool steps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.tool_steps import ToolPlanner
from flowtrial.instrumentation.turns.classify import (
    RULES,
    Context,
    classify,
    client_name,
    features,
)
from flowtrial.study.config import ConfigError, parse_study

TOOLS_CHAT = [{"type": "function", "function": {"name": "list_dir", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]
USER = {"role": "user", "content": "fix the bug"}
OPEN = Context(turn_open=True, turn_conversation="k-agent", turn_model="big",
               turn_offers_tools=True, turn_client="agent", client="agent")


def kind(protocol: str, body: dict[str, Any], ctx: Context | None = None) -> tuple[str, str]:
    return classify(features(protocol, body), ctx or Context())


@pytest.mark.parametrize(("protocol", "body", "expected"), [
    ("chat", {"messages": [USER]}, ("human", "new_input")),
    ("chat", {"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c"}]},
                           {"role": "tool", "tool_call_id": "c", "content": "x"}]},
     ("continuation", "tool_output:chat:tool_message")),
    ("chat", {"messages": [USER, {"role": "assistant", "content": "x"},
                           {"role": "function", "name": "f", "content": "x"}]},
     ("continuation", "tool_output:chat:function_message")),
    # a system message after the last user message does not hide it
    ("messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                               {"role": "system", "content": "reminder"}]},
     ("human", "new_input")),
    ("messages", {"messages": [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "LS", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"},
                                     {"type": "text", "text": "<reminder>"}]}]},
     ("continuation", "tool_output:messages:tool_result")),
    ("responses", {"input": "hello"}, ("human", "new_input")),
    ("responses", {"input": [{"role": "user", "content": "hi"},
                             {"type": "function_call", "call_id": "c", "name": "f"},
                             {"type": "function_call_output", "call_id": "c", "output": "x"}]},
     ("continuation", "tool_output:responses:function_call_output")),
    ("responses", {"input": [{"role": "user", "content": "hi"},
                             {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"},
                             {"type": "custom_tool_call_output", "call_id": "c", "output": "x"}]},
     ("continuation", "tool_output:responses:custom_tool_call_output")),
    ("responses", {"previous_response_id": "resp_1", "input": [
        {"type": "function_call_output", "call_id": "c", "output": "x"}]},
     ("continuation", "tool_output:responses:previous_response_tool_output")),
    ("responses", {"previous_response_id": "resp_1", "input": [
        {"role": "user", "content": "and now?"}]}, ("human", "new_input")),
    ("completions", {"prompt": "def f(", "max_tokens": 1}, ("human", "completions")),
    ("chat", {"messages": [USER], "max_tokens": 1}, ("side", "probe")),
    ("chat", {"messages": [USER], "response_format": {"type": "json_schema"}},
     ("side", "structured_without_tools")),
    ("messages", {"messages": [USER], "output_config": {"format": {"type": "json_schema"}}},
     ("side", "structured_without_tools")),
    # effort settings are not a format
    ("messages", {"messages": [USER], "output_config": {"effort": "high"}},
     ("human", "new_input")),
])
def test_rules_without_context(protocol: str, body: dict[str, Any],
                               expected: tuple[str, str]) -> None:
    assert kind(protocol, body) == expected


def test_retry_is_the_same_request_in_the_window_but_never_a_completion() -> None:
    assert kind("chat", {"messages": [USER]}, Context(repeat=True)) == (
        "retry", "identical_request")
    assert kind("completions", {"prompt": "x"}, Context(repeat=True)) == (
        "human", "completions")


def test_side_calls_relative_to_the_open_turn() -> None:
    title = {"model": "small", "messages": [{"role": "system", "content": "Title this"},
                                            USER]}
    assert kind("chat", title, OPEN) == ("side", "other_conversation_while_open")
    # The same request with the turn's own conversation is not a side call.
    f = features("chat", title)
    same = Context(**{**OPEN.__dict__, "turn_conversation": f.conversation_key})
    assert classify(f, same) == ("human", "new_input")
    # Another conversation with tools and the same model: a second agent session, human.
    other = {"model": "big", "tools": TOOLS_CHAT, "messages": [USER]}
    assert kind("chat", other, OPEN) == ("human", "new_input")
    # After the turn ended: the agent's tool-less request on another conversation is side,
    # a chat client's (another User-Agent) is the person's.
    closed = Context(**{**OPEN.__dict__, "turn_open": False})
    assert kind("chat", title, closed) == ("side", "tool_client_without_tools")
    chat_client = Context(**{**closed.__dict__, "client": "my-chat"})
    assert kind("chat", title, chat_client) == ("human", "new_input")


def test_every_rule_is_documented_and_named_once() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) and all(r.doc for r in RULES)
    assert {r.kind for r in RULES} == {"human", "continuation", "side", "retry"}


def test_conversation_key_ignores_later_messages() -> None:
    a = features("chat", {"messages": [{"role": "system", "content": "S"}, USER]})
    b = features("chat", {"messages": [{"role": "system", "content": "S"}, USER,
                                       {"role": "assistant", "content": "x"},
                                       {"role": "user", "content": "more"}]})
    c = features("chat", {"messages": [{"role": "system", "content": "T"}, USER]})
    assert a.conversation_key == b.conversation_key != c.conversation_key


@pytest.mark.parametrize(("ua", "name"), [
    ("claude-cli/2.1.197 (external, sdk-cli)", "claude-cli"),
    ("codex_exec/0.169.0 (Debian 12.0.0; x86_64) dumb", "codex"),
    ("OpenAI/Python 1.99.0", "openai/python"),
    ("Anthropic/Python 0.60.0", "anthropic/python"),
    ("", None), (None, None),
])
def test_client_name(ua: str | None, name: str | None) -> None:
    assert client_name(ua) == name


# ---------------------------------------------------------------------------- tool steps


CLAUDE_TOOLS = [
    {"name": "Read", "input_schema": {"type": "object", "properties": {
        "file_path": {"type": "string"}}, "required": ["file_path"]}},
    {"name": "Bash", "input_schema": {"type": "object", "properties": {
        "command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"]}},
]
CODEX_TOOLS = [{"type": "function", "name": "exec_command", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "function", "name": "apply_patch", "parameters": {"type": "object"}}]


def test_tool_steps_pick_a_harmless_tool_then_answer() -> None:
    planner = ToolPlanner(2, seed=1)
    body: dict[str, Any] = {"tools": CLAUDE_TOOLS, "messages": [USER]}
    first = planner.plan("messages", body)
    assert first is not None and first.name == "Bash" and first.step == 1
    assert json.loads(first.arguments) == {"command": "pwd"}
    assert planner.plan("messages", body) == first  # deterministic
    assert ToolPlanner(2, seed=2).plan("messages", body).call_id != first.call_id
    body["messages"] = [USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]
    assert planner.plan("messages", body).step == 2
    body["messages"] += body["messages"][1:]
    assert planner.plan("messages", body) is None  # two steps done: the text answer
    # A listing tool is preferred to a shell; no harmless tool, no tool call.
    chat = {"messages": [USER], "tools": TOOLS_CHAT}
    assert planner.plan("chat", chat).name == "list_dir"
    assert planner.plan("chat", {"messages": [USER], "tools": [
        {"type": "function", "function": {"name": "write_file"}}]}) is None
    assert ToolPlanner(0).plan("chat", chat) is None
    codex = planner.plan("responses", {"tools": CODEX_TOOLS, "input": "hi"})
    assert codex is not None and json.loads(codex.arguments) == {"cmd": "pwd"}


@pytest.mark.anyio
async def test_mock_model_answers_a_tool_call_in_each_protocol() -> None:
    model = MockModel(tokens_per_second=10_000, ttft_ms=1, tool_steps=1)
    chat = await model.respond("POST", "/v1/chat/completions", {}, json.dumps(
        {"model": "m", "messages": [USER], "tools": TOOLS_CHAT}).encode())
    body = json.loads(await chat.read())
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "list_dir"
    msg = await model.respond("POST", "/v1/messages", {}, json.dumps(
        {"model": "m", "max_tokens": 50, "messages": [USER], "tools": CLAUDE_TOOLS}).encode())
    body = json.loads(await msg.read())
    assert body["stop_reason"] == "tool_use" and body["content"][0]["name"] == "Bash"
    resp = await model.respond("POST", "/v1/responses", {}, json.dumps(
        {"model": "m", "input": "hi", "tools": CODEX_TOOLS, "stream": True}).encode())
    raw = (await resp.read()).decode()
    assert "response.function_call_arguments.delta" in raw and '"exec_command"' in raw


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_tool_steps_config_is_validated() -> None:
    base = {"study": {"name": "t", "design": "parallel"}, "arms": [{"name": "a"}]}
    assert parse_study({**base, "upstream": {"tool_steps": 3}}).upstream.tool_steps == 3
    with pytest.raises(ConfigError, match="tool_steps"):
        parse_study({**base, "upstream": {"tool_steps": -1}})
    with pytest.raises(ConfigError, match="tool_steps drives the built-in simulated model"):
        parse_study({**base, "upstream": {"tool_steps": 2, "kind": "openai",
                                          "base_url": "https://x", "api_key_env": "K"}})


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
_FIELDS = ("messages", "input", "system", "instructions", "tools", "model", "text",
           "previous_response_id", "output_config", "response_format", "max_tokens")


@settings(max_examples=300, deadline=None)
@given(protocol=st.sampled_from(["chat", "messages", "responses", "completions"]),
       body=st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=6))
def test_features_take_any_body_shape(protocol: str, body: dict) -> None:
    """Classification runs before the upstream sees a body: a field of the wrong shape (the
    fuzz test once sent ``"messages": 0`` to /v1/messages, a 500) reads as absent."""
    f = features(protocol, body)
    assert f.protocol == protocol
    if not isinstance(body.get("messages"), list) and protocol in ("chat", "messages"):
        assert f.ends == "empty"
