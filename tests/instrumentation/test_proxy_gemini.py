"""Google's Gemini API through the real proxy with the official ``google-genai`` SDK: the
model in the URL, ``x-goog-api-key`` and ``?key=``, ``generateContent``, the ``alt=sse``
stream and the JSON-array stream, function declarations / calls / responses (tool steps and
their classification), ``countTokens``, the model list, Google's error shape, and unknown
paths counted in the log."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

from flowtrial.instrumentation.proxy import serve_proxy
from tests.instrumentation.proxy_servers import on_time

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
MODEL = "flowtrial-sim-1"
PROMPT = "write a python function that reverses a list"
LIST_DIR = types.FunctionDeclaration(
    name="list_directory", description="List a directory",
    parameters_json_schema={"type": "object", "properties": {"dir_path": {"type": "string"}},
                            "required": ["dir_path"]})


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    """A shaped proxy (ttft 150 ms, 800 tok/s) over a fast simulated model taking 2 tool
    steps."""
    s = make_study_module({"upstream": {"tool_steps": 2,
                                        "mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                           "capture": {"content": "full"},
                           "arms": [{"name": "a", "ttft_ms": 150, "tokens_per_second": 800}]})
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def client(url: str, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=url,
                                                                    api_version="v1beta"))


def rows(s, sql: str = "SELECT * FROM cycles WHERE protocol = 'gemini' ORDER BY t_request_ns"
         ) -> list[Any]:
    return [r._mapping for r in s.rows(sql)]


def test_generate_content_and_sse_stream(served) -> None:
    s, px = served
    c = client(px.base_url, s.key)
    before = len(rows(s))
    whole = c.models.generate_content(model=MODEL, contents=PROMPT)
    streamed = list(c.models.generate_content_stream(model=MODEL, contents=PROMPT))
    got = rows(s)[before:]
    assert len(got) == 2
    one, two = got
    assert (one["protocol"], one["model"], one["stream"], one["status"]) == (
        "gemini", MODEL, False, "ok")
    assert one["content_text"] == whole.text and whole.text
    assert (one["tokens_prompt"], one["tokens_completion"]) == (
        whole.usage_metadata.prompt_token_count, whole.usage_metadata.candidates_token_count)
    assert one["upstream_response_id"] == whole.response_id
    text = "".join(ch.text or "" for ch in streamed)
    assert two["stream"] and two["status"] == "ok" and two["content_text"] == text
    assert streamed[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert two["tokens_completion"] == streamed[-1].usage_metadata.candidates_token_count
    assert two["experienced_ttft_ms"] >= 150 and on_time(two)
    assert (one["request_kind"], two["request_kind"]) == ("human", "retry") or two[
        "request_kind"] in ("human", "retry")


def test_json_array_stream_and_query_key(served) -> None:
    """Without ``alt=sse`` the stream is one JSON array, written piece by piece; the key may
    come as ``?key=`` and never reaches the upstream or the record."""
    s, px = served
    url = f"{px.base_url}/v1beta/models/{MODEL}:streamGenerateContent?key={s.key}"
    body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_raw())
        cid = r.headers["x-flowtrial-cycle-id"]
    chunks = json.loads(raw)
    assert isinstance(chunks, list) and len(chunks) > 1
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    (row,) = [r for r in rows(s) if r["id"] == cid]
    text = "".join(p["text"] for ch in chunks for p in ch["candidates"][0]["content"]["parts"])
    assert row["status"] == "ok" and row["stream"] and row["content_text"] == text
    assert s.key not in json.dumps({k: str(v) for k, v in row.items()})


def test_function_calls_drive_a_multi_step_turn(served) -> None:
    """The simulated model answers with ``functionCall`` parts for two steps, then text; the
    follow-ups carrying ``functionResponse`` are continuations of one human turn."""
    s, px = served
    c = client(px.base_url, s.key)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[LIST_DIR])],
                                         automatic_function_calling=types.
                                         AutomaticFunctionCallingConfig(disable=True))
    # A prompt of its own: the same text as the previous test's, sent within the typing
    # window after that test's answer, would rightly continue that conversation's turn.
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(
        text=PROMPT + ", using the files in this folder")])]
    before = len(rows(s))
    calls = 0
    for _ in range(4):
        chunks = list(c.models.generate_content_stream(model=MODEL, contents=contents,
                                                       config=config))
        fcs = [fc for ch in chunks for fc in (ch.function_calls or [])]
        if not fcs:
            break
        calls += len(fcs)
        assert fcs[0].name == "list_directory" and fcs[0].args == {"dir_path": "."}
        contents.append(types.Content(role="model", parts=[types.Part(function_call=fcs[0])]))
        contents.append(types.Content(role="user", parts=[types.Part.from_function_response(
            name=fcs[0].name, response={"output": "a.py\nb.py"})]))
    assert calls == 2
    got = rows(s)[before:]
    assert [r["request_kind"] for r in got] == ["human", "continuation", "continuation"]
    assert got[1]["kind_rule"] == "tool_output:gemini:function_response"
    assert len({r["turn_id"] for r in got}) == 1
    assert [r["tool_calls"] for r in got] == [1, 1, 0]


def test_count_tokens_models_and_errors(served, caplog) -> None:
    s, px = served
    c = client(px.base_url, s.key)
    assert c.models.count_tokens(model=MODEL, contents=PROMPT).total_tokens > 0
    names = [m.name for m in c.models.list()]
    assert f"models/{MODEL}" in names
    bad = client(px.base_url, "ft_not-a-key")
    with pytest.raises(genai.errors.ClientError) as err:
        bad.models.generate_content(model=MODEL, contents=PROMPT)
    assert err.value.code == 401 and err.value.status == "UNAUTHENTICATED"
    r = httpx.post(f"{px.base_url}/v1beta/models/{MODEL}:generateContent",
                   headers={"x-goog-api-key": s.key}, content=b"[1]", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    with caplog.at_level(logging.WARNING, logger="flowtrial.proxy"):
        for _ in range(2):
            r = httpx.post(f"{px.base_url}/v1beta/models/{MODEL}:embedContent",
                           headers={"x-goog-api-key": s.key}, json={"secret": "body-text"},
                           timeout=30)
            assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    logged = [rec.getMessage() for rec in caplog.records if "unknown path" in rec.getMessage()]
    assert any(f"/v1beta/models/{MODEL}:embedContent" in m and "(2 request(s)" in m
               for m in logged), logged
    assert not any("body-text" in m or s.key in m for m in logged)
