"""MockModel in-process: wire shapes, determinism, limits, inline detection, errors."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.corpus import load_corpus
from flowtrial.instrumentation.tokens import count_tokens

pytestmark = pytest.mark.anyio

FAST = {"tokens_per_second": math.inf, "ttft_ms": 0.0}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def post(model: MockModel, path: str, body: Any, headers: dict[str, str] | None = None,
               method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await model.respond(method, path, headers or {}, raw)
    return reply.status, reply.headers, await reply.read()


def sse(raw: bytes) -> list[tuple[str | None, str]]:
    """Parse an SSE body into (event name, data) pairs."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        events.append((name, "\n".join(data)))
    return events


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "any-model", "messages": [{"role": "user", "content": content}], **extra}


async def chat_text(model: MockModel, content: str, **extra: Any) -> str:
    status, _, raw = await post(model, "/v1/chat/completions", chat(content, **extra))
    assert status == 200
    return json.loads(raw)["choices"][0]["message"]["content"]


# ----------------------------------------------------------------------------- corpus


def test_corpus_is_varied_in_language_kind_and_length() -> None:
    corpus = load_corpus()
    assert len(corpus.chat) + len([a for a in corpus.code if "#" not in a.id]) >= 40
    assert {"python", "typescript", "go", "rust", "sql", "shell"} <= {a.family for a in corpus.chat}
    lengths = [count_tokens(a.text) for a in corpus.chat + corpus.code]
    assert min(lengths) <= 25 and max(lengths) >= 700
    assert all("```" not in a.text for a in corpus.code)  # code answers are bare code


# ------------------------------------------------------------------------ determinism


async def test_same_seed_and_request_give_the_same_answer() -> None:
    a, b = MockModel(seed=3, **FAST), MockModel(seed=3, **FAST)
    for prompt in ["write a retry decorator", "explain window functions", "hello"]:
        assert await chat_text(a, prompt) == await chat_text(b, prompt)


async def test_different_prompts_and_seeds_vary_the_answer() -> None:
    model = MockModel(seed=0, **FAST)
    prompts = [f"question number {i}: how would you structure this?" for i in range(12)]
    answers = {await chat_text(model, p) for p in prompts}
    assert len(answers) >= 6
    other = MockModel(seed=1, **FAST)
    mine = [await chat_text(model, p) for p in prompts]
    assert mine != [await chat_text(other, p) for p in prompts]


async def test_language_named_in_the_prompt_steers_the_answer() -> None:
    model = MockModel(**FAST)
    text = await chat_text(model, "How do I handle errors in Rust without a crate?")
    assert "```rust" in text
    text = await chat_text(model, "Slow query on PostgreSQL, what index do I need?")
    assert "```sql" in text


# ------------------------------------------------------------------------ chat shapes


async def test_chat_stream_shape_and_usage() -> None:
    model = MockModel(**FAST)
    body = chat("python please", stream=True, stream_options={"include_usage": True})
    status, headers, raw = await post(model, "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == count_tokens(text)
    assert usage["prompt_tokens"] == count_tokens("python please")
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the streamed text is the non-streamed answer
    assert text == await chat_text(model, "python please")


async def test_max_tokens_truncates_in_every_protocol() -> None:
    model = MockModel(**FAST)
    limit = 7
    _, _, raw = await post(model, "/v1/chat/completions", chat("c ring buffer", max_tokens=limit))
    done = json.loads(raw)
    assert done["choices"][0]["finish_reason"] == "length"
    assert count_tokens(done["choices"][0]["message"]["content"]) == limit
    assert done["usage"]["completion_tokens"] == limit

    body = chat("c ring buffer", max_completion_tokens=limit)
    _, _, raw = await post(model, "/v1/chat/completions", body)
    assert json.loads(raw)["usage"]["completion_tokens"] == limit

    _, _, raw = await post(model, "/v1/completions",
                           {"model": "m", "prompt": "int main(", "max_tokens": limit})
    assert json.loads(raw)["choices"][0]["finish_reason"] == "length"

    _, _, raw = await post(model, "/v1/responses",
                           {"model": "m", "input": "c code", "max_output_tokens": limit})
    resp = json.loads(raw)
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["usage"]["output_tokens"] == limit

    _, _, raw = await post(model, "/v1/messages", {
        "model": "m", "max_tokens": limit, "messages": [{"role": "user", "content": "c code"}],
    })
    msg = json.loads(raw)
    assert msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == limit


async def test_stop_sequences_cut_the_answer() -> None:
    model = MockModel(**FAST)
    full = await chat_text(model, "explain")
    cut = await chat_text(model, "explain", stop=["\n"])
    assert "\n" in full and cut == full[: full.index("\n", 1)]
    _, _, raw = await post(model, "/v1/messages", {
        "model": "m", "max_tokens": 500, "stop_sequences": ["\n"],
        "messages": [{"role": "user", "content": "explain"}],
    })
    msg = json.loads(raw)
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "\n"


async def test_gemini_limits_in_either_spelling() -> None:
    """Google's JSON takes camelCase and snake_case (google-genai sends the latter): the
    simulated model reads both, through the Gemini protocol module's view."""
    model = MockModel(**FAST)
    contents = [{"role": "user", "parts": [{"text": "explain"}]}]
    path = "/v1beta/models/flowtrial-sim-1:generateContent"
    _, _, raw = await post(model, path, {"contents": contents})
    full = json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"]
    for config in ({"maxOutputTokens": 5}, {"max_output_tokens": 5}):
        _, _, raw = await post(model, path, {"contents": contents, "generationConfig": config})
        answer = json.loads(raw)
        assert answer["candidates"][0]["finishReason"] == "MAX_TOKENS"
        assert answer["usageMetadata"]["candidatesTokenCount"] == 5
    _, _, raw = await post(model, path, {"contents": contents,
                                         "generation_config": {"stop_sequences": ["\n"]}})
    cut = json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"]
    assert "\n" in full and cut == full[: full.index("\n", 1)]


# ------------------------------------------------------------------ inline completion


async def test_completions_with_suffix_answer_bare_code() -> None:
    model = MockModel(**FAST)
    body = {"model": "m", "prompt": "def chunked(iterable, size):\n", "suffix": "\n\nprint(1)\n"}
    _, _, raw = await post(model, "/v1/completions", body)
    done = json.loads(raw)
    assert done["object"] == "text_completion" and done["id"].startswith("cmpl-")
    text = done["choices"][0]["text"]
    assert text and "```" not in text
    assert any(text == a.text for a in load_corpus().code if a.family == "python")


async def test_chat_that_looks_like_inline_completion_gets_bare_code() -> None:
    model = MockModel(**FAST)
    for messages in (
        [{"role": "user", "content": "<|fim_prefix|>def area(r):\n<|fim_suffix|>\n<|fim_middle|>"}],
        [{"role": "system", "content": "You are a code autocomplete engine."},
         {"role": "user", "content": "const total = items."}],
    ):
        _, _, raw = await post(model, "/v1/chat/completions", {"model": "m", "messages": messages})
        text = json.loads(raw)["choices"][0]["message"]["content"]
        assert any(text == a.text for a in load_corpus().code)


# ------------------------------------------------------------------ coding agents


async def test_codex_style_responses_request_gets_a_plain_text_answer() -> None:
    model = MockModel(**FAST)
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are a coding agent; never autocomplete. " * 50,
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>...</permissions>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Fix the failing test in utils.py"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell",
             "arguments": "{\"command\": [\"pytest\"]}"},
            {"type": "function_call_output", "call_id": "c1", "output": "1 failed"},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB..."},
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc",
    }
    status, _, raw = await post(model, "/v1/responses", body)
    assert status == 200
    events = sse(raw)
    names = [name for name, _ in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    payloads = [json.loads(data) for _, data in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert all(p["type"] == name for (name, _), p in zip(events, payloads, strict=True))
    final = payloads[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message"]  # never a tool call
    # tools mark an agent: a prose answer, even with autocomplete-ish words in the prompt
    assert final["output"][0]["content"][0]["text"] in {a.text for a in load_corpus().chat}
    # instructions, every input item's text and the tool definitions are all counted
    assert final["usage"]["input_tokens"] > count_tokens(body["instructions"]) + 20
    assert final["tools"] == body["tools"] and final["reasoning"] == body["reasoning"]


async def test_claude_code_style_messages_request_gets_a_plain_text_answer() -> None:
    model = MockModel(**FAST)
    body = {
        "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code.",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
            {"type": "text", "text": "Why is my Go build slow?"}]}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "metadata": {"user_id": "u"}, "tool_choice": {"type": "auto"},
    }
    status, headers, raw = await post(model, "/v1/messages?beta=true", body)
    assert status == 200 and "request-id" in headers
    events = sse(raw)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    payloads = [json.loads(data) for _, data in events]
    deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta"}
    assert payloads[1]["content_block"]["type"] == "text"
    text = "".join(d["text"] for d in deltas)
    assert payloads[-2]["usage"]["output_tokens"] == count_tokens(text)
    assert payloads[-2]["delta"]["stop_reason"] == "end_turn"
    assert payloads[0]["message"]["usage"]["input_tokens"] > 0


# ------------------------------------------------------------------ ids and models


async def test_cycle_id_header_becomes_the_response_id() -> None:
    model = MockModel(**FAST)
    headers = {"X-Flowtrial-Cycle-Id": "c0ffee"}
    cases = [
        ("/v1/chat/completions", chat("hi"), "chatcmpl-c0ffee"),
        ("/v1/completions", {"model": "m", "prompt": "x ="}, "cmpl-c0ffee"),
        ("/v1/responses", {"model": "m", "input": "hi"}, "resp_c0ffee"),
        ("/v1/messages", {"model": "m", "max_tokens": 9, "messages": [
            {"role": "user", "content": "hi"}]}, "msg_c0ffee"),
    ]
    for path, body, expected in cases:
        _, _, raw = await post(model, path, body, headers)
        assert json.loads(raw)["id"] == expected
        _, _, raw = await post(model, path, body)
        assert json.loads(raw)["id"] != expected


async def test_models_list_and_unversioned_paths() -> None:
    model = MockModel(**FAST)
    status, _, raw = await post(model, "/v1/models", b"", method="GET")
    listing = json.loads(raw)
    assert status == 200 and listing["object"] == "list"
    assert "flowtrial-sim-1" in [m["id"] for m in listing["data"]]
    assert listing == model.models()
    status, _, raw = await post(model, "/chat/completions", chat("hi"))
    assert status == 200 and json.loads(raw)["object"] == "chat.completion"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_openai_errors_use_the_openai_shape(path: str) -> None:
    model = MockModel(**FAST)
    status, headers, raw = await post(model, path, b"{not json")
    error = json.loads(raw)["error"]
    assert status == 400 and headers["content-type"] == "application/json"
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"

    status, _, raw = await post(model, path, {"messages": [], "prompt": "x", "input": "x"})
    assert status == 400 and json.loads(raw)["error"]["param"] == "model"


async def test_missing_and_invalid_fields_are_400() -> None:
    model = MockModel(**FAST)
    for path, body, param in [
        ("/v1/chat/completions", {"model": "m"}, "messages"),
        ("/v1/chat/completions", chat("x", max_tokens=0), "max_tokens"),
        ("/v1/completions", {"model": "m"}, "prompt"),
        ("/v1/responses", {"model": "m", "input": 5}, "input"),
    ]:
        status, _, raw = await post(model, path, body)
        assert status == 400 and json.loads(raw)["error"]["param"] == param, (path, raw)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_anthropic_errors_use_the_anthropic_shape(path: str) -> None:
    model = MockModel(**FAST)
    for body, needle in [(b"[1, 2", "JSON"), ({"model": "m"}, "messages"),
                         ({"messages": []}, "model")]:
        status, _, raw = await post(model, path, body)
        payload = json.loads(raw)
        assert status == 400 and payload["type"] == "error"
        assert payload["error"]["type"] == "invalid_request_error"
        assert needle in payload["error"]["message"]
    if path == "/v1/messages":
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        status, _, raw = await post(model, path, body)
        assert status == 400 and "max_tokens" in json.loads(raw)["error"]["message"]


async def test_unknown_path_and_wrong_method() -> None:
    model = MockModel(**FAST)
    status, _, raw = await post(model, "/v1/embeddingz", {})
    assert status == 404 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    status, _, raw = await post(model, "/v1/chat/completions", b"", method="GET")
    assert status == 405 and "error" in json.loads(raw)
    status, _, raw = await post(model, "/v1/messages", b"", method="GET")
    assert status == 405 and json.loads(raw)["type"] == "error"


async def test_count_tokens_counts_the_request_text() -> None:
    model = MockModel(**FAST)
    body = {"model": "m", "system": "be brief",
            "messages": [{"role": "user", "content": "count these words please"}]}
    status, _, raw = await post(model, "/v1/messages/count_tokens", body)
    assert status == 200
    assert json.loads(raw) == {"input_tokens": count_tokens("be brief")
                               + count_tokens("count these words please")}


# ----------------------------------------------------------------- WebSocket (in-process)


async def test_respond_ws_events_and_errors() -> None:
    model = MockModel(**FAST)
    events = [e async for e in model.respond_ws(
        {"type": "response.create", "model": "m", "input": "hi", "stream_id": "lane-1"})]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert all(e["stream_id"] == "lane-1" for e in events)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == events[-1]["response"]["output"][0]["content"][0]["text"]

    warm = [e async for e in model.respond_ws(
        {"type": "response.create", "model": "m", "input": "hi", "generate": False})]
    assert [e["type"] for e in warm] == ["response.created", "response.in_progress",
                                         "response.completed"]
    assert warm[-1]["response"]["output"] == []

    for bad in ({"type": "session.update"}, {"type": "response.create", "input": "no model"}):
        errors = [e async for e in model.respond_ws(bad)]
        assert len(errors) == 1 and errors[0]["type"] == "error"
        assert errors[0]["status"] == 400 and errors[0]["error"]["message"]


def test_constructor_rejects_impossible_pacing() -> None:
    with pytest.raises(ValueError):
        MockModel(tokens_per_second=0)
    with pytest.raises(ValueError):
        MockModel(ttft_ms=-1)


def test_schedule_never_releases_a_token_early_under_uvloop() -> None:
    """uvloop (what uvicorn runs) fires timers up to ~1 ms early off its cached clock."""
    import time

    import uvloop

    from flowtrial.instrumentation.mock_model.generation import Schedule

    async def main() -> list[float]:
        early = []
        for i in range(120):
            when = time.monotonic() + 0.0007 + (i % 7) * 0.0013
            await Schedule(0.0, 0.0, 1.0).sleep_until(when)
            early.append(when - time.monotonic())
        return early

    assert max(uvloop.run(main())) <= 0


# ----------------------------------------------------------------------------- long answers


async def test_answer_tokens_makes_long_answers_deterministic_for_a_seed() -> None:
    model = MockModel(**FAST, answer_tokens=(2000, 2000))
    for prompt in ("explain python generators", "a ring buffer in C code", "sql joins"):
        status, _, raw = await post(model, "/v1/chat/completions", chat(prompt))
        done = json.loads(raw)
        text = done["choices"][0]["message"]["content"]
        assert status == 200 and done["choices"][0]["finish_reason"] == "stop"
        # Exactly the length asked, counted the way the proxy counts what it sends.
        assert count_tokens(text) == done["usage"]["completion_tokens"] == 2000
        assert text == await chat_text(MockModel(**FAST, answer_tokens=(2000, 2000)), prompt)
    ranged = MockModel(**FAST, seed=3, answer_tokens=(1500, 3000))
    lengths = {count_tokens(await chat_text(ranged, f"explain decorators {i}"))
               for i in range(6)}
    assert all(1500 <= n <= 3000 for n in lengths) and len(lengths) > 1
    other = MockModel(**FAST, seed=4, answer_tokens=(1500, 3000))
    assert await chat_text(other, "explain decorators 0") != await chat_text(
        ranged, "explain decorators 0")
    # The request's own max_tokens still caps a long answer.
    _, _, raw = await post(model, "/v1/chat/completions", chat("explain python", max_tokens=50))
    capped = json.loads(raw)
    assert capped["choices"][0]["finish_reason"] == "length"
    assert capped["usage"]["completion_tokens"] == 50


async def test_answer_tokens_paces_a_long_stream_on_every_protocol() -> None:
    model = MockModel(**FAST, answer_tokens=(2500, 2500))
    _, _, raw = await post(model, "/v1/messages", {
        "model": "m", "max_tokens": 4096, "stream": True,
        "messages": [{"role": "user", "content": "explain rust lifetimes"}]})
    deltas = [json.loads(d) for n, d in sse(raw) if n == "content_block_delta"]
    text = "".join(d["delta"]["text"] for d in deltas)
    assert count_tokens(text) == 2500
    _, _, raw = await post(model, "/v1/responses", {"model": "m", "input": "go channels"})
    assert json.loads(raw)["usage"]["output_tokens"] == 2500


def test_answer_tokens_must_be_a_sane_range() -> None:
    for bad in [(0, 10), (20, 10)]:
        with pytest.raises(ValueError):
            MockModel(answer_tokens=bad)
