"""Tool-call answers get the arm's latency (issue 17): an arm is a model speed, so a model at
20 tokens/s writes a call's arguments at 20 tokens/s and its first output — here a tool call
— comes after the TTFT floor. With the official SDKs on every protocol that carries tool
calls (Chat Completions, Messages, Responses over HTTP and WebSocket), against the simulated
model with ``tool_steps`` (a tool-only answer): the call's first event arrives no earlier
than the floor, its arguments once their last token is due, the SDK parses the call intact,
and the cycle row's timeline is the call's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.tokens import count_tokens
from tests.instrumentation.proxy_servers import on_time

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
MODEL = "flowtrial-sim-1"
TTFT_S, TPS = 0.3, 20.0
ASK = "What is in this folder?"
_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
_LS = {"name": "list_dir", "description": "List a directory", "parameters": _PARAMS}


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    s = make_study_module({"upstream": {"tool_steps": 1,
                                        "mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                           "capture": {"content": "full"},
                           "arms": [{"name": "a", "ttft_ms": TTFT_S * 1000,
                                     "tokens_per_second": TPS}]})
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def _last_row(s: Any) -> Any:
    return s.rows("SELECT * FROM cycles ORDER BY t_request_ns DESC LIMIT 1")[0]._mapping


def _check(s: Any, got: list[tuple[float, Any]], t_start: float, t_args: float,
           arguments: str) -> None:
    """The call's start at the floor, its arguments when their last token is due, the row's
    timeline the call's (arguments counted in tokens_sent, no text content)."""
    n = count_tokens(arguments)
    assert n >= 3 and json.loads(arguments) == {"path": "."}
    # Times from just before the request: never earlier than the schedule (the client may
    # see an event late on a busy machine, so the spread's lower bound is loose).
    assert t_start >= TTFT_S
    # Upper bound from the stream's first event (structure, not held), so the SDK's lazy
    # imports on a first call do not count.
    assert t_start - got[0][0] < TTFT_S + 0.4
    assert t_args >= TTFT_S + (n - 1) / TPS
    spread = t_args - t_start
    assert (n - 1) / TPS - 0.04 <= spread < (n - 1) / TPS + 0.4, (n, spread)
    row = _last_row(s)
    assert row["tool_calls"] == 1 and row["status"] == "ok" and row["content_text"] == ""
    assert row["tokens_sent"] == n and on_time(row)
    assert TTFT_S * 1000 <= row["experienced_ttft_ms"] < TTFT_S * 1000 + 250
    assert row["target_ttft_ms"] == TTFT_S * 1000
    assert row["generation_wait_ms"] >= TTFT_S * 1000 + (n - 1) / TPS * 1000 - 5
    assert row["achieved_tps"] == pytest.approx(TPS, rel=0.25)


def _timed(events: Iterator[Any], t0: float, last: Callable[[Any], bool]
           ) -> list[tuple[float, Any]]:
    out = []
    for ev in events:
        out.append((time.monotonic() - t0, ev))
        if last(ev):
            break
    return out


@pytest.mark.timing
def test_chat_tool_call_is_held_and_paced(served) -> None:
    s, px = served
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
    t0 = time.monotonic()
    with c.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                   tools=[{"type": "function", "function": _LS}]) as st:
        got = _timed((e for e in st if e.type == "chunk"), t0, lambda e: False)
        final = st.get_final_completion()
    tool = [(t, e.chunk.choices[0].delta.tool_calls[0]) for t, e in got
            if e.chunk.choices and e.chunk.choices[0].delta.tool_calls]
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "list_dir" and final.choices[0].finish_reason == "tool_calls"
    # Never re-split: the model's two deltas (the call's start, then its arguments) intact.
    assert [d.function.arguments for _, d in tool] == ["", call.function.arguments]
    _check(s, got, tool[0][0], tool[-1][0], call.function.arguments)


@pytest.mark.timing
def test_messages_tool_use_is_held_and_paced(served) -> None:
    s, px = served
    c = anthropic.Anthropic(base_url=px.base_url, api_key=s.key, max_retries=0)
    tools = [{"name": "LS", "description": "List files", "input_schema": _PARAMS}]
    t0 = time.monotonic()
    with c.messages.stream(model=MODEL, max_tokens=200, tools=tools,
                           messages=[{"role": "user", "content": ASK}]) as st:
        got = _timed(iter(st), t0, lambda e: False)
        msg = st.get_final_message()
    start = next(t for t, e in got if e.type == "content_block_start"
                 and e.content_block.type == "tool_use")
    parts = [(t, e.delta.partial_json) for t, e in got if e.type == "content_block_delta"
             and e.delta.type == "input_json_delta"]
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == "LS" and msg.stop_reason == "tool_use"
    arguments = "".join(p for _, p in parts)
    assert json.loads(arguments) == block.input
    _check(s, got, start, parts[-1][0], arguments)


def _responses_check(s: Any, got: list[tuple[float, Any]]) -> None:
    added = next(t for t, e in got if e.type == "response.output_item.added"
                 and e.item.type == "function_call")
    deltas = [(t, e.delta) for t, e in got if e.type == "response.function_call_arguments.delta"]
    done = next(e for _, e in got if e.type == "response.completed").response
    call = next(o for o in done.output if o.type == "function_call")
    assert call.name == "list_dir" and [d for _, d in deltas] == [call.arguments]
    _check(s, got, added, deltas[-1][0], call.arguments)


@pytest.mark.timing
def test_responses_function_call_is_held_and_paced(served) -> None:
    s, px = served
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
    for _ in range(2):  # the first builds the SDK's event types (~0.4 s of the client's CPU)
        t0 = time.monotonic()
        with c.responses.stream(model=MODEL, input=ASK,
                                tools=[{"type": "function", **_LS}]) as st:
            got = _timed(iter(st), t0, lambda e: False)
    _responses_check(s, got)


@pytest.mark.timing
def test_responses_websocket_function_call_is_held_and_paced(served) -> None:
    s, px = served
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
    with c.responses.connect() as conn:
        for _ in range(2):  # the first builds the SDK's event types (the client's CPU)
            t0 = time.monotonic()
            conn.response.create(model=MODEL, input=ASK, tools=[{"type": "function", **_LS}])
            got = _timed(iter(conn), t0, lambda e: e.type in ("response.completed", "error"))
    assert got[-1][1].type == "response.completed", got[-1][1]
    _responses_check(s, got)
    assert _last_row(s)["transport"] == "websocket"


@pytest.mark.timing
def test_all_at_once_holds_the_tool_call_with_the_rest(make_study) -> None:
    """``all_at_once``: the call's start and its arguments are held and leave together at
    t_request + ttft + n/tps (n from the model's usage)."""
    s = make_study({"upstream": {"tool_steps": 1,
                                 "mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                    "arms": [{"name": "held", "ttft_ms": 200, "tokens_per_second": TPS,
                              "delivery": "all_at_once"}]})
    with serve_proxy(s.db, s.config) as px:
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        t0 = time.monotonic()
        got = [(time.monotonic() - t0, ch) for ch in c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": ASK}], stream=True,
            stream_options={"include_usage": True},
            tools=[{"type": "function", "function": _LS}])]
    tool = [t for t, ch in got if ch.choices and ch.choices[0].delta.tool_calls]
    usage = next(ch.usage for _, ch in got if ch.usage is not None)
    assert len(tool) == 2 and tool[-1] - tool[0] < 0.02  # together
    assert tool[0] >= 0.2 + usage.completion_tokens / TPS
    row = _last_row(s)
    assert row["tool_calls"] == 1 and row["frame_ms"] is None and on_time(row)
    assert row["experienced_ttft_ms"] >= 200 + usage.completion_tokens / TPS * 1000


def _whole_call(protocol: str, base_url: str, key: str) -> str:
    """A non-streaming tool-only answer through the official SDK; its arguments as sent."""
    if protocol == "messages":
        a = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)
        msg = a.messages.create(model=MODEL, max_tokens=200, messages=[
            {"role": "user", "content": ASK}],
            tools=[{"name": "LS", "description": "List files", "input_schema": _PARAMS}])
        assert msg.content[0].type == "tool_use"
        return json.dumps(msg.content[0].input)
    c = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
    if protocol == "chat":
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                      tools=[{"type": "function", "function": _LS}])
        return r.choices[0].message.tool_calls[0].function.arguments
    resp = c.responses.create(model=MODEL, input=ASK, tools=[{"type": "function", **_LS}])
    return next(o for o in resp.output if o.type == "function_call").arguments


@pytest.mark.parametrize("protocol", ["chat", "messages", "responses"])
def test_whole_tool_answer_counts_its_arguments(served, protocol: str) -> None:
    """A non-streaming tool-only answer counts its arguments in tokens_sent, as its stream
    would: the call is output the model wrote at the arm's pace."""
    s, px = served
    arguments = _whole_call(protocol, px.base_url, s.key)
    assert json.loads(arguments) == {"path": "."}
    row = _last_row(s)
    assert row["stream"] in (0, False) and row["tool_calls"] == 1 and row["status"] == "ok"
    assert row["tokens_sent"] == count_tokens(arguments) >= 3
