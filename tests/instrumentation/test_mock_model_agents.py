"""MockModel and the request shapes real agents send (captured from Codex CLI 0.169 and
Claude Code 2.1.197, trimmed): mid-conversation system turns, structured-output side calls
(session titles), echoed Responses settings."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.corpus import load_corpus
from flowtrial.instrumentation.mock_model.structured import json_answer

pytestmark = pytest.mark.anyio

FAST = {"tokens_per_second": math.inf, "ttft_ms": 0.0}
TITLE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}},
    "required": ["title"],
    "additionalProperties": False,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    reply = await MockModel(**FAST).respond("POST", path, {}, json.dumps(body).encode())
    return reply.status, await reply.read()


def sse_payloads(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def anthropic_text(raw: bytes) -> str:
    return "".join(p["delta"]["text"] for p in sse_payloads(raw)
                   if p["type"] == "content_block_delta")


async def test_claude_code_turn_with_a_system_message_inside_messages() -> None:
    # Claude Code 2.1 sends role "system" turns in `messages` (mid-conversation-system beta).
    body = {
        "model": "flowtrial-sim-1", "max_tokens": 64000, "stream": True,
        "system": [{"type": "text", "text": "You are a Claude agent."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Write a Go HTTP handler"}]},
            {"role": "system", "content": "Available agent types for the Agent tool: ..."},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    status, raw = await post("/v1/messages?beta=true", body)
    assert status == 200
    assert anthropic_text(raw) in {a.text for a in load_corpus().chat}
    body["messages"][1]["role"] = "robot"
    status, raw = await post("/v1/messages", body)
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


async def test_claude_code_title_call_gets_json_matching_its_schema() -> None:
    body = {
        "model": "flowtrial-sim-1", "max_tokens": 32000, "stream": True, "tools": [],
        "system": [{"type": "text", "text": "Generate a concise, sentence-case title."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text":
            "<session>\nWrite a python function that reverses a string\n</session>"}]}],
        "output_config": {"effort": "high",
                          "format": {"type": "json_schema", "schema": TITLE_SCHEMA}},
    }
    status, raw = await post("/v1/messages", body)
    assert status == 200
    answer = json.loads(anthropic_text(raw))
    jsonschema.validate(answer, TITLE_SCHEMA)
    assert answer["title"] == "Write a python function that reverses"  # from the prompt


async def test_codex_title_call_over_responses_respects_max_length() -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["title"],
              "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 36}}}
    body = {
        "model": "flowtrial-sim-1", "stream": True, "store": False, "tools": [],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text",
                   "text": "Generate a concise, single-line task title of at most 36 "
                           "characters.\n\nUser prompt:\nAdd a --verbose flag"}]}],
        "text": {"format": {"type": "json_schema", "name": "codex_output_schema",
                            "strict": True, "schema": schema}},
        "prompt_cache_key": "01a1fe67-ac17", "include": ["reasoning.encrypted_content"],
    }
    status, raw = await post("/v1/responses", body)
    assert status == 200
    payloads = sse_payloads(raw)
    done = next(p for p in payloads if p["type"] == "response.output_text.done")
    jsonschema.validate(json.loads(done["text"]), schema)
    final = payloads[-1]["response"]
    assert final["text"] == body["text"] and final["store"] is False
    assert final["prompt_cache_key"] == "01a1fe67-ac17"


async def test_chat_completions_json_modes() -> None:
    schema = {"type": "object", "properties": {"files": {"type": "array", "minItems": 2,
              "items": {"type": "string"}}, "count": {"type": "integer", "minimum": 3}},
              "required": ["files", "count"]}
    for response_format, check in (
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, schema),
        ({"type": "json_object"}, {"type": "object"}),
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "list files"}],
                "response_format": response_format}
        status, raw = await post("/v1/chat/completions", body)
        assert status == 200
        jsonschema.validate(json.loads(json.loads(raw)["choices"][0]["message"]["content"]), check)
    body["response_format"] = {"type": "text"}
    _, raw = await post("/v1/chat/completions", body)
    assert json.loads(raw)["choices"][0]["message"]["content"] in {
        a.text for a in load_corpus().chat}


@pytest.mark.parametrize("schema", [
    {"$defs": {"step": {"type": "object", "properties": {
        "kind": {"enum": ["edit", "run"]}, "note": {"anyOf": [{"type": "null"},
                                                               {"type": "string"}]}},
        "required": ["kind", "note"]}},
     "type": "object", "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}},
                                      "done": {"type": "boolean"},
                                      "score": {"type": "number", "exclusiveMinimum": 0}},
     "required": ["steps", "done", "score"]},
    {"type": ["object", "null"], "properties": {"v": {"const": 2}, "n": {"type": "integer"}}},
    {"type": "array", "items": {"type": "integer", "minimum": 5}, "minItems": 3},
])
def test_json_answers_validate_against_their_schema(schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(json_answer(schema, "make a plan")), schema)
