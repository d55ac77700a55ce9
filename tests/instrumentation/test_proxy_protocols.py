"""Every protocol path through the real proxy with the official ``openai`` SDK (sync and
async, streaming and not), the simulated model in-process as upstream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from flowtrial.instrumentation.proxy import create_proxy_app, serve_proxy
from flowtrial.instrumentation.proxy.upstream import MockUpstream
from tests.instrumentation.proxy_servers import ScriptedUpstream, chat_stream, sse
from tests.instrumentation.servers import run_asgi_server

# Recording and reading back are storage paths: run them on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

MODEL = "flowtrial-sim-1"
MSG = [{"role": "system", "content": "be brief"},
       {"role": "user", "content": "write a python function that reverses a list"}]


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    """An unshaped (team-mode) proxy over a fast simulated model, shared by the module."""
    s = make_study_module({"upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                    "capture": {"content": "full"}})
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def client(px, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=px.base_url + "/v1", api_key=key, max_retries=0)


def cycle(s, cid: str):
    rows = s.rows("SELECT * FROM cycles WHERE id = :i", {"i": cid})
    assert len(rows) == 1, f"cycle {cid} not recorded"
    return rows[0]._mapping


def test_chat_streaming_with_usage_is_recorded(served) -> None:
    s, px = served
    c = client(px, s.key)
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, stream=True, stream_options={"include_usage": True},
        max_tokens=40)
    cid = raw.headers["x-flowtrial-cycle-id"]
    chunks = list(raw.parse())
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[0].id.endswith(cid)  # the simulated model puts the cycle id in its id
    row = cycle(s, cid)
    assert row["protocol"] == "chat" and row["stream"] and row["status"] == "ok"
    assert row["participant_id"] == "p01" and row["arm"] == "team" and not row["shaped"]
    assert row["usage_exact"] and row["tokens_completion"] == chunks[-1].usage.completion_tokens
    assert row["tokens_prompt"] == chunks[-1].usage.prompt_tokens
    assert row["content_text"] == text and row["content_chars"] == len(text)
    assert row["prompt_text"] == MSG[-1]["content"]
    assert json.loads(row["prompt_fingerprint"]) and json.loads(row["content_fingerprint"])
    assert row["upstream_response_id"] == chunks[0].id and row["model"] == MODEL
    assert row["upstream"] == "mock" and row["http_status"] == 200
    t = [row[k] for k in ("t_request_ns", "t_upstream_first_ns", "t_first_sent_ns",
                          "t_last_sent_ns", "t_done_ns")]
    assert t == sorted(t)
    assert row["experienced_ttft_ms"] == pytest.approx((t[2] - t[0]) / 1e6)
    assert row["target_ttft_ms"] is None and row["violation_ms"] is None


def test_chat_non_streaming_sync_and_async(served) -> None:
    s, px = served
    r = client(px, s.key).chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=25)
    body = r.parse()
    row = cycle(s, r.headers["x-flowtrial-cycle-id"])
    assert not row["stream"] and row["status"] == "ok"
    assert row["content_text"] == body.choices[0].message.content
    assert row["tokens_completion"] == body.usage.completion_tokens and row["usage_exact"]

    async def go() -> tuple[str, str]:
        ac = openai.AsyncOpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        r1 = await ac.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10)
        stream = await ac.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10,
                                                  stream=True)
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        await ac.close()
        return r1.choices[0].message.content, "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole and streamed
    texts = {r[0] for r in s.rows("SELECT content_text FROM cycles")}
    assert {whole, streamed} <= texts


def test_completions_with_suffix(served) -> None:
    s, px = served
    c = client(px, s.key)
    raw = c.completions.with_raw_response.create(
        model=MODEL, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
        stream=True, max_tokens=20)
    cid = raw.headers["x-flowtrial-cycle-id"]
    text = "".join(ch.choices[0].text for ch in raw.parse() if ch.choices)
    row = cycle(s, cid)
    assert row["protocol"] == "completions" and row["content_text"] == text and text
    assert row["prompt_text"] == "def add(a, b):\n    \n\n\nprint(add(1, 2))\n"
    assert not row["usage_exact"] and row["tokens_completion"] == row["tokens_sent"] > 0
    whole = c.completions.create(model=MODEL, prompt="import os\n", suffix="\n", max_tokens=8)
    assert whole.choices[0].text


def test_responses_streaming_and_not(served) -> None:
    s, px = served
    c = client(px, s.key)
    raw = c.responses.with_raw_response.create(model=MODEL, input="explain list reversal",
                                               stream=True, max_output_tokens=30)
    events = list(raw.parse())
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-1] in ("response.completed", "response.incomplete")  # max tokens hit
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(seq)))
    row = cycle(s, raw.headers["x-flowtrial-cycle-id"])
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert row["protocol"] == "responses" and row["content_text"] == deltas
    usage = events[-1].response.usage
    assert row["usage_exact"] and row["tokens_completion"] == usage.output_tokens
    assert row["upstream_response_id"] == events[-1].response.id
    whole = c.responses.with_raw_response.create(model=MODEL, input="hi", max_output_tokens=12)
    row = cycle(s, whole.headers["x-flowtrial-cycle-id"])
    assert row["content_text"] == whole.parse().output_text and not row["stream"]


def test_models_list_needs_a_key(served) -> None:
    s, px = served
    ids = [m.id for m in client(px, s.key).models.list().data]
    assert MODEL in ids
    with pytest.raises(openai.AuthenticationError):
        client(px, "ft_nope_nope").models.list()


def test_unknown_fields_pass_through_both_ways(make_study) -> None:
    """Request bodies reach the upstream byte for byte; unknown response fields survive,
    also when a delta is split into token-sized pieces."""
    s = make_study({"arms": [{"name": "team"},
                             {"name": "slow", "tokens_per_second": 180, "frame_ms": 0}],
                    "study": {"design": "parallel"}}, participants=("p01", "p02"))
    extra = {"x_vendor": {"a": [1, 2.5, None]}, "service_tier": "flex"}
    up = ScriptedUpstream([(0, c) for c in chat_stream(["Hello big world, again"],
                                                        extra=extra)])
    app = create_proxy_app(s.database, s.config, upstream=up)
    body = json.dumps({"model": "m", "messages": MSG, "stream": True,
                       "x_client_field": {"keep": "me"}, "temperature": 0.25}).encode()
    with run_asgi_server(app) as url:
        for pid, key in s.keys.items():
            r = httpx.post(url + "/v1/chat/completions", content=body,
                           headers={"authorization": f"Bearer {key}"})
            chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {")]
            assert all(c["x_vendor"] == extra["x_vendor"] for c in chunks), pid
            content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
            assert "".join(x or "" for x in content) == "Hello big world, again"
            arm = s.rows("SELECT arm FROM cycles WHERE id = :i",
                         {"i": r.headers["x-flowtrial-cycle-id"]})[0][0]
            n_content = sum(1 for x in content if x)
            assert n_content == (5 if arm == "slow" else 1)  # split into tokens when paced
            assert r.text.rstrip().endswith("data: [DONE]")
            assert r.headers["x-request-id"] == "req_scripted"
    assert all(req[2] == body for req in up.requests)
    assert all(req[1]["x-flowtrial-cycle-id"].startswith("cyc_") for req in up.requests)
    assert all("authorization" not in req[1] for req in up.requests)


def test_responses_split_renumbers_sequence(make_study) -> None:
    s = make_study({"arms": [{"name": "slow", "tokens_per_second": 150, "frame_ms": 0}]})
    ev = [
        ({"type": "response.created", "response": {"id": "resp_1"}}, "response.created"),
        ({"type": "response.output_text.delta", "delta": "one two three", "item_id": "i",
          "output_index": 0, "content_index": 0}, "response.output_text.delta"),
        ({"type": "response.output_text.delta", "delta": " four", "item_id": "i",
          "output_index": 0, "content_index": 0}, "response.output_text.delta"),
        ({"type": "response.output_text.done", "text": "one two three four"},
         "response.output_text.done"),
        ({"type": "response.completed", "response": {"id": "resp_1", "usage": {
            "input_tokens": 3, "output_tokens": 4}}}, "response.completed"),
    ]
    chunks = [(0, sse({**obj, "sequence_number": i}, name)) for i, (obj, name) in enumerate(ev)]
    app = create_proxy_app(s.database, s.config, upstream=ScriptedUpstream(chunks))
    with run_asgi_server(app) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
        events = list(c.responses.create(model="m", input="x", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["one", " two", " three", " four"]
    assert events[-1].type == "response.completed"
    row = s.rows("SELECT tokens_sent, tokens_completion, usage_exact FROM cycles")[0]
    assert tuple(row) == (4, 4, True)


@pytest.mark.timing
def test_tool_call_deltas_are_paced_whole_and_counted(make_study) -> None:
    """Tool-call deltas are model output: the call's first chunk is held by the TTFT floor,
    each argument delta leaves whole (never re-split) once its last token is due at the pace
    (5 + 7 + 1 argument tokens at 50 tokens/s), text after them follows on the same schedule;
    the call is counted in tool_calls, its argument tokens in tokens_sent."""
    s = make_study({"capture": {"content": "full"},
                    "arms": [{"name": "slow", "ttft_ms": 300, "tokens_per_second": 50}]})
    tc = {"index": 0, "id": "call_1", "type": "function",
          "function": {"name": "read_file", "arguments": ""}}
    args = ['{"path": "a', '.py", "limit": 20', "}"]

    def chunk(delta: dict) -> bytes:
        return sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                    "choices": [{"index": 0, "delta": delta}]})

    chunks = [chat_stream([])[0], chunk({"tool_calls": [tc]})]
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
               for a in args]
    chunks += [chunk({"content": "and then some text"}), b"data: [DONE]\n\n"]
    app = create_proxy_app(s.database, s.config, upstream=ScriptedUpstream([(0, c) for c in
                                                                            chunks]))
    with run_asgi_server(app) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
        t0 = time.monotonic()
        got = []
        for ch in c.chat.completions.create(model="m", messages=MSG, stream=True):
            got.append((time.monotonic() - t0, ch))
    tool = [(t, ch.choices[0].delta.tool_calls[0]) for t, ch in got
            if ch.choices and ch.choices[0].delta.tool_calls]
    assert [d.function.arguments for _, d in tool] == ["", *args]  # intact, never re-split
    t_start = tool[0][0]
    assert 0.3 <= t_start < 0.5  # the call's start is the first output: held by the floor
    # Each argument delta once its last token is due (tokens 4, 11 and 12 after the start).
    for (t, _), k in zip(tool[1:], (4, 11, 12), strict=True):
        assert t - t_start >= k / 50 - 0.005
    texts = [(t, ch.choices[0].delta.content) for t, ch in got
             if ch.choices and ch.choices[0].delta.content]
    assert "".join(x for _, x in texts) == "and then some text" and len(texts) > 1
    assert min(t for t, _ in texts) - t_start >= 13 / 50 - 0.005
    row = s.rows("SELECT tool_calls, experienced_ttft_ms, tokens_sent, content_text, violation "
                 "FROM cycles")[0]
    assert row[0] == 1 and 300 <= row[1] < 500 and row[2] == 13 + len(texts)
    assert row[3] == "and then some text" and not row[4]


def test_async_client_against_app_with_mock_upstream_object(make_study) -> None:
    """create_proxy_app with an explicit in-process MockUpstream (no HTTP to the model)."""
    s = make_study()
    app = create_proxy_app(s.database, s.config,
                           upstream=MockUpstream(tokens_per_second=50000, ttft_ms=1, seed=3))

    async def go(url: str) -> list[str]:
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
        outs = await asyncio.gather(*[
            ac.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": str(i)}],
                                       max_tokens=5) for i in range(5)])
        await ac.close()
        return [o.id for o in outs]

    with run_asgi_server(app) as url:
        ids = asyncio.run(go(url))
    assert len(set(ids)) == 5
    assert len(s.rows("SELECT id FROM cycles WHERE status = 'ok'")) == 5
