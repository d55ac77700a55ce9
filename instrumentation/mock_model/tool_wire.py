"""Tool-call answers (``tool_steps``) in each protocol's wire format, streamed and whole.

Shapes follow the official APIs as the SDKs parse them: Chat ``delta.tool_calls`` with
``finish_reason: "tool_calls"``; a Responses ``function_call`` output item with
``response.function_call_arguments.delta/.done``; an Anthropic ``tool_use`` block with
``input_json_delta`` and ``stop_reason: "tool_use"``. The call goes out after the TTFT.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ..tokens import count_tokens
from .generation import Job
from .openai_wire import (
    DONE,
    _response,
    _responses_usage,
    event_maker,
    sse_data,
    sse_event,
)

__all__ = [
    "chat_tool_body",
    "chat_tool_stream",
    "messages_tool_body",
    "messages_tool_stream",
    "responses_tool_body",
    "responses_tool_events",
]


def _out_tokens(job: Job) -> int:
    assert job.tool_call is not None
    return max(1, count_tokens(job.tool_call.arguments))


async def _after_ttft(job: Job) -> None:
    await job.schedule.sleep_until(job.schedule.due(0))


# ------------------------------------------------------------------- Chat Completions


def _chat_usage(job: Job) -> dict[str, Any]:
    n = _out_tokens(job)
    p = job.gen.prompt_tokens
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def _chat_call(job: Job, arguments: str, with_id: bool) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    out: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if with_id:
        out |= {"id": call.call_id, "type": "function"}
        out["function"]["name"] = call.name
    return out


def chat_tool_body(job: Job) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    return {
        "id": job.id, "object": "chat.completion", "created": job.created,
        "model": job.turn.model,
        "choices": [{"index": 0, "message": {
            "role": "assistant", "content": None, "refusal": None, "annotations": [],
            "tool_calls": [{"id": call.call_id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}}]},
            "logprobs": None, "finish_reason": "tool_calls"}],
        "usage": _chat_usage(job), "service_tier": "default", "system_fingerprint": None,
    }


async def chat_tool_stream(job: Job) -> AsyncIterator[bytes]:
    assert job.tool_call is not None

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": job.id, "object": "chat.completion.chunk", "created": job.created,
            "model": job.turn.model, "service_tier": "default", "system_fingerprint": None,
            "choices": [] if delta is None else [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if job.turn.include_usage:
            body["usage"] = _chat_usage(job) if delta is None else None
        return sse_data(body)

    yield chunk({"role": "assistant", "content": None, "refusal": None})
    await _after_ttft(job)
    yield chunk({"tool_calls": [_chat_call(job, "", True)]})
    yield chunk({"tool_calls": [_chat_call(job, job.tool_call.arguments, False)]})
    yield chunk({}, "tool_calls")
    if job.turn.include_usage:
        yield chunk(None)
    yield DONE


# ------------------------------------------------------------------------- Responses


def _call_item(job: Job, status: str, arguments: str) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    return {"id": "fc_" + job.item_id.removeprefix("msg_"), "type": "function_call",
            "status": status, "arguments": arguments, "call_id": call.call_id,
            "name": call.name}


def _usage(job: Job) -> dict[str, Any]:
    n = _out_tokens(job)
    return {**_responses_usage(job), "output_tokens": n,
            "total_tokens": job.gen.prompt_tokens + n}


def responses_tool_body(job: Job) -> dict[str, Any]:
    assert job.tool_call is not None
    item = _call_item(job, "completed", job.tool_call.arguments)
    return _response(job, "completed", [item], _usage(job))


async def responses_tool_events(job: Job) -> AsyncIterator[dict[str, Any]]:
    """The Responses events of a function-call answer (SSE and WebSocket alike)."""
    call = job.tool_call
    assert call is not None
    event = event_maker(job)

    yield event("response.created", response=_response(job, "in_progress"))
    yield event("response.in_progress", response=_response(job, "in_progress"))
    await _after_ttft(job)
    item_id = _call_item(job, "", "")["id"]
    yield event("response.output_item.added", output_index=0,
                item=_call_item(job, "in_progress", ""))
    yield event("response.function_call_arguments.delta", item_id=item_id, output_index=0,
                delta=call.arguments)
    yield event("response.function_call_arguments.done", item_id=item_id, output_index=0,
                arguments=call.arguments)
    done = _call_item(job, "completed", call.arguments)
    yield event("response.output_item.done", output_index=0, item=done)
    yield event("response.completed", response=_response(job, "completed", [done], _usage(job)))


# ------------------------------------------------------------------ Anthropic Messages


def _tool_use(job: Job, with_input: bool) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    return {"type": "tool_use", "id": "toolu_" + call.call_id.removeprefix("call_"),
            "name": call.name, "input": json.loads(call.arguments) if with_input else {}}


def _message(job: Job, content: list[dict[str, Any]], stop: str | None, n: int
             ) -> dict[str, Any]:
    return {"id": job.id, "type": "message", "role": "assistant", "model": job.turn.model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": job.gen.prompt_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": n,
                      "service_tier": "standard"}}


def messages_tool_body(job: Job) -> dict[str, Any]:
    return _message(job, [_tool_use(job, True)], "tool_use", _out_tokens(job))


async def messages_tool_stream(job: Job) -> AsyncIterator[bytes]:
    call = job.tool_call
    assert call is not None
    yield sse_event("message_start", {"type": "message_start",
                                      "message": _message(job, [], None, 1)})
    await _after_ttft(job)
    yield sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": _tool_use(job, False)})
    yield sse_event("content_block_delta", {
        "type": "content_block_delta", "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": call.arguments}})
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield sse_event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": _out_tokens(job)}})
    yield sse_event("message_stop", {"type": "message_stop"})
