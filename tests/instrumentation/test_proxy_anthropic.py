"""Anthropic Messages through the real proxy with the official ``anthropic`` SDK: streaming
and not, ``messages.stream()``, tool use, ping keep-alives, unknown events, errors in
Anthropic's shape, count_tokens, ``HEAD /``, and the anthropic upstream side."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from flowtrial.instrumentation.proxy import create_proxy_app, serve_proxy
from flowtrial.instrumentation.proxy.routing import UpstreamRouter
from flowtrial.instrumentation.proxy.upstream import UpstreamError
from tests.instrumentation.proxy_servers import ScriptedUpstream, on_time, sse
from tests.instrumentation.servers import run_asgi_server

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
MODEL = "flowtrial-sim-1"
USER = [{"role": "user", "content": "write a python function that reverses a list"}]


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    """A shaped proxy (ttft 150 ms, 800 tok/s) over a fast simulated model."""
    s = make_study_module({"upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                           "capture": {"content": "full"},
                           "arms": [{"name": "a", "ttft_ms": 150, "tokens_per_second": 800}]})
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def client(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def cycle(s, cid: str) -> Any:
    rows = s.rows("SELECT * FROM cycles WHERE id = :i", {"i": cid})
    assert len(rows) == 1, f"cycle {cid} not recorded"
    return rows[0]._mapping


def test_create_streaming_and_not(served) -> None:
    s, px = served
    c = client(px.base_url, s.key)
    raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=40, messages=USER)
    msg = raw.parse()
    row = cycle(s, raw.headers["x-flowtrial-cycle-id"])
    assert not row["stream"] and row["protocol"] == "messages" and row["status"] == "ok"
    assert row["content_text"] == msg.content[0].text
    assert (row["tokens_prompt"], row["tokens_completion"]) == (msg.usage.input_tokens,
                                                                 msg.usage.output_tokens)
    assert row["experienced_ttft_ms"] >= 150 and row["upstream_response_id"] == msg.id

    raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=40, messages=USER,
                                              stream=True)
    events = list(raw.parse())
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert [events[0].type, events[-2].type, events[-1].type] == [
        "message_start", "message_delta", "message_stop"]
    row = cycle(s, raw.headers["x-flowtrial-cycle-id"])
    assert row["stream"] and row["status"] == "ok" and row["content_text"] == text
    # usage: input from message_start, output from message_delta
    assert row["tokens_prompt"] == events[0].message.usage.input_tokens
    assert row["tokens_completion"] == events[-2].usage.output_tokens and row["usage_exact"]
    assert row["experienced_ttft_ms"] >= 150 and on_time(row)
    deltas = [e for e in events if e.type == "content_block_delta"]
    # 800 tokens/s is faster than one token per 8 ms frame: the model's deltas are split only
    # where they span frames, never below one token. (How many tokens the model put in each
    # delta depends on its own timer, so a quiet machine may see one token per delta:
    # test_proxy_frames.py checks the frame split on scripted deltas.)
    assert 1 < len(deltas) <= row["tokens_sent"] and row["frame_ms"] == 8


def test_messages_stream_helper_text_and_final_message(served) -> None:
    s, px = served
    c = client(px.base_url, s.key)
    with c.messages.stream(model=MODEL, max_tokens=30, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "max_tokens"
    row = s.rows("SELECT content_text, tokens_completion FROM cycles ORDER BY t_request_ns "
                 "DESC LIMIT 1")[0]
    assert tuple(row) == (text, final.usage.output_tokens)


def test_count_tokens_root_probe_and_query_string(served) -> None:
    s, px = served
    before = s.rows("SELECT count(*) FROM cycles")[0][0]
    n = client(px.base_url, s.key).messages.count_tokens(model=MODEL, messages=USER)
    assert n.input_tokens > 0
    assert s.rows("SELECT count(*) FROM cycles")[0][0] == before  # not a cycle
    assert httpx.head(px.base_url + "/").status_code == 200
    assert httpx.get(px.base_url + "/").json()["status"] == "ok"
    # Claude Code's `?beta=true` reaches the Messages route.
    r = httpx.post(px.base_url + "/v1/messages?beta=true", headers={"x-api-key": s.key},
                   json={"model": MODEL, "max_tokens": 5, "messages": USER})
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_errors_in_anthropic_shape(make_study) -> None:
    s = make_study({"proxy": {"max_body_bytes": 2000}})
    with serve_proxy(s.db, s.config) as px:
        with pytest.raises(anthropic.AuthenticationError) as auth:
            client(px.base_url, "ft_wrong").messages.create(model=MODEL, max_tokens=5,
                                                            messages=USER)
        assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        url = px.base_url + "/v1/messages"
        bad = httpx.post(url, headers={"authorization": f"Bearer {s.key}"}, content=b"{nope")
        big = httpx.post(url, headers={"x-api-key": s.key}, content=b" " * 5000)
        # The upstream's own refusal (no max_tokens) comes back as is, and is recorded.
        refused = httpx.post(url, headers={"x-api-key": s.key},
                             json={"model": MODEL, "messages": USER})
        missing = httpx.post(px.base_url + "/v1/messages/nope", headers={"x-api-key": s.key})
    for r, status, kind in ((bad, 400, "invalid_request_error"), (big, 413, "request_too_large"),
                            (refused, 400, "invalid_request_error"),
                            (missing, 404, "not_found_error")):
        assert r.status_code == status, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind
    row = s.rows("SELECT status, http_status, protocol FROM cycles")
    assert [tuple(x) for x in row] == [("error", 400, "messages")]


def _msg_events(blocks: list[bytes]) -> list[bytes]:
    start = sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 1}}}, "message_start")
    end = [sse({"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                   "stop_sequence": None},
                "usage": {"output_tokens": 17}}, "message_delta"),
           sse({"type": "message_stop"}, "message_stop")]
    return [start, *blocks, *end]


def _tool_block(index: int, parts: list[str]) -> list[bytes]:
    out = [sse({"type": "content_block_start", "index": index, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}},
        "content_block_start")]
    out += [sse({"type": "content_block_delta", "index": index,
                 "delta": {"type": "input_json_delta", "partial_json": p}},
                "content_block_delta") for p in parts]
    return out + [sse({"type": "content_block_stop", "index": index}, "content_block_stop")]


def _text_block(index: int, texts: list[str]) -> list[bytes]:
    out = [sse({"type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    out += [sse({"type": "content_block_delta", "index": index,
                 "delta": {"type": "text_delta", "text": t}}, "content_block_delta")
            for t in texts]
    return out + [sse({"type": "content_block_stop", "index": index}, "content_block_stop")]


PARTS = ['{"pa', 'th": "src/a', '.py", "lines": [1, 2]}']


@pytest.mark.timing
def test_tool_use_is_paced_whole_behind_the_floor(make_study) -> None:
    """A tool_use block first: the block's start is the first output, held by the 300 ms TTFT
    floor; its input_json_delta events are never re-split, each leaves whole once its last
    argument token is due at 50 tokens/s (2 + 5 + 11 tokens); the text after it follows on
    the same schedule; an unknown event type passes through. The row's timeline is the
    output's (arguments included)."""
    s = make_study({"capture": {"content": "full"},
                    "arms": [{"name": "slow", "ttft_ms": 300, "tokens_per_second": 50}]})
    unknown = sse({"type": "flowtrial_future_event", "x": 1}, "flowtrial_future_event")
    chunks = _msg_events([*_tool_block(0, PARTS), unknown, *_text_block(1, ["Reading it now."])])
    app = create_proxy_app(s.database, s.config, upstream=ScriptedUpstream(
        [(0, c) for c in chunks]))
    with run_asgi_server(app) as url:
        t0 = time.monotonic()
        seen: list[tuple[float, str, Any]] = []
        with httpx.stream("POST", url + "/v1/messages", headers={"x-api-key": s.key},
                          json={"model": "m", "max_tokens": 50, "messages": USER,
                                "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    obj = json.loads(line[6:])
                    seen.append((time.monotonic() - t0, obj["type"], obj))
        with client(url, s.key).messages.stream(model="m", max_tokens=50,
                                                messages=USER) as st:
            msg = st.get_final_message()
    partials = [(t, o["delta"]["partial_json"]) for t, typ, o in seen
                if typ == "content_block_delta" and o["delta"]["type"] == "input_json_delta"]
    assert [p for _, p in partials] == PARTS  # never re-split
    t_start = next(t for t, typ, o in seen if typ == "content_block_start"
                   and o["content_block"]["type"] == "tool_use")
    t_text = min(t for t, typ, o in seen if typ == "content_block_delta"
                 and o["delta"]["type"] == "text_delta")
    # Floor on the call's start; each part when its last token is due (tokens 1, 6, 17).
    assert 0.3 <= t_start < 0.5
    for (t, _), k in zip(partials, (1, 6, 17), strict=True):
        assert t - t_start >= k / 50 - 0.005
    assert partials[-1][0] - t_start < 17 / 50 + 0.2
    assert t_text - t_start >= 18 / 50 - 0.005
    assert any(t == "flowtrial_future_event" for _, t, _ in seen)
    assert msg.content[0].type == "tool_use" and msg.content[0].input == {
        "path": "src/a.py", "lines": [1, 2]}
    assert msg.content[1].text == "Reading it now."
    rows = [r._mapping for r in s.rows(
        "SELECT tool_calls, tokens_prompt, tokens_completion, content_text, tokens_sent, "
        "violation, violation_ms, experienced_ttft_ms, achieved_tps FROM cycles")]
    # tokens_sent: 18 argument tokens + 4 text tokens; the content is the text only.
    assert [tuple(r.values())[:5] for r in rows] == [(1, 11, 17, "Reading it now.", 22)] * 2
    assert all(300 <= r["experienced_ttft_ms"] < 500 and on_time(r) for r in rows)
    assert all(40 <= r["achieved_tps"] <= 51 for r in rows)


def test_ping_keepalives_during_a_long_injected_wait(make_study) -> None:
    s = make_study({"proxy": {"keepalive_s": 0.1},
                    "arms": [{"name": "slow", "ttft_ms": 700}]})
    chunks = _msg_events(_text_block(0, ["hello"]))
    app = create_proxy_app(s.database, s.config, upstream=ScriptedUpstream(
        [(0, c) for c in chunks]))
    with run_asgi_server(app) as url:
        with httpx.stream("POST", url + "/v1/messages", headers={"x-api-key": s.key},
                          json={"model": "m", "max_tokens": 5, "messages": USER,
                                "stream": True}) as r:
            body = r.read().decode()
        with client(url, s.key).messages.stream(model="m", max_tokens=5,
                                                messages=USER) as st:
            assert st.get_final_text() == "hello"
    before_text = body.split('"text_delta"')[0]
    assert before_text.count('event: ping\ndata: {"type": "ping"}') >= 4


def test_upstream_failure_mid_stream_is_an_anthropic_error_event(make_study) -> None:
    s = make_study()
    chunks = _msg_events(_text_block(0, ["partial"]))[:4]
    up = ScriptedUpstream([(0, c) for c in chunks],
                          fail_after=UpstreamError(502, "upstream connection failed"))
    app = create_proxy_app(s.database, s.config, upstream=up)
    with run_asgi_server(app) as url:
        with httpx.stream("POST", url + "/v1/messages", headers={"x-api-key": s.key},
                          json={"model": "m", "max_tokens": 5, "messages": USER,
                                "stream": True}) as r:
            body = r.read().decode()
        with pytest.raises(anthropic.APIStatusError) as err:
            with client(url, s.key).messages.stream(model="m", max_tokens=5,
                                                    messages=USER) as st:
                st.get_final_text()
    last = body.strip().split("\n\n")[-1]
    assert last.startswith("event: error\n")
    assert json.loads(last.split("data: ", 1)[1]) == {"type": "error", "error": {
        "type": "api_error", "message": "upstream connection failed"}}
    assert "upstream connection failed" in str(err.value)
    rows = s.rows("SELECT status, error FROM cycles")
    assert [tuple(r) for r in rows] == [("upstream_error", "upstream connection failed")] * 2


def test_router_sends_messages_to_the_anthropic_side_with_its_key(make_study, monkeypatch
                                                                  ) -> None:
    """[upstream.openai] and [upstream.anthropic] side by side: Messages and count_tokens go
    to the Anthropic base URL with x-api-key from the named variable, anthropic-version and
    -beta passed through; chat goes to the OpenAI side."""
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app

    seen: list[tuple[str, str, dict[str, str]]] = []

    def capture(side: str, app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append((side, scope["path"] + "?" + scope["query_string"].decode(),
                             {k.decode(): v.decode() for k, v in scope["headers"]}))
            await app(scope, receive, send)
        return wrapped

    model = MockModel(tokens_per_second=20000, ttft_ms=1)
    monkeypatch.setenv("FT_TEST_OPENAI_KEY", "sk-openai-test")
    monkeypatch.setenv("FT_TEST_ANTHROPIC_KEY", "sk-ant-test")
    with run_asgi_server(capture("openai", create_mock_app(model))) as oai, \
            run_asgi_server(capture("anthropic", create_mock_app(model))) as ant:
        s = make_study({"upstream": {
            "kind": "openai",
            "openai": {"base_url": oai + "/v1", "api_key_env": "FT_TEST_OPENAI_KEY"},
            "anthropic": {"base_url": ant, "api_key_env": "FT_TEST_ANTHROPIC_KEY"}}})
        router = UpstreamRouter.from_config(s.config)
        assert router.for_family("anthropic").name == "anthropic:127.0.0.1"
        with serve_proxy(s.db, s.config) as px:
            c = anthropic.Anthropic(base_url=px.base_url, api_key=s.key, max_retries=0,
                                    default_headers={"anthropic-beta": "test-beta-1",
                                                     "anthropic-version": "2099-01-01"})
            c.messages.create(model=MODEL, max_tokens=5, messages=USER)
            c.messages.count_tokens(model=MODEL, messages=USER)
            httpx.post(px.base_url + "/v1/messages?beta=true", headers={"x-api-key": s.key},
                       json={"model": MODEL, "max_tokens": 5, "messages": USER})
            httpx.post(px.base_url + "/v1/chat/completions", headers={
                "authorization": f"Bearer {s.key}"}, json={"model": MODEL, "messages": USER})
    sides = [(side, path) for side, path, _ in seen]
    assert sides == [("anthropic", "/v1/messages?"),
                     ("anthropic", "/v1/messages/count_tokens?"),
                     ("anthropic", "/v1/messages?beta=true"),
                     ("openai", "/v1/chat/completions?")]
    first = seen[0][2]
    assert first["x-api-key"] == "sk-ant-test" and "authorization" not in first
    assert first["anthropic-version"] == "2099-01-01" and first["anthropic-beta"] == "test-beta-1"
    assert seen[2][2]["anthropic-version"] == "2023-06-01"  # defaulted: the client sent none
    assert seen[3][2]["authorization"] == "Bearer sk-openai-test"
    assert all(s.key not in json.dumps(h) for _, _, h in seen)  # the participant key stays
