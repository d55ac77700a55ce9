"""OpenAI wire formats: Chat Completions, legacy Completions and Responses (bodies and events).

Shapes follow the official API (and what the `openai` SDK's types parse): chunk objects on
`data:` lines ending with `data: [DONE]` for Chat / Completions; named events with a
`sequence_number` and no `[DONE]` for Responses.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .generation import Job

__all__ = [
    "chat_body",
    "chat_stream",
    "completions_body",
    "completions_stream",
    "dumps",
    "event_maker",
    "openai_error",
    "responses_body",
    "responses_events",
    "responses_sse",
    "sse_data",
    "sse_event",
    "ws_error",
]

DONE = b"data: [DONE]\n\n"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(obj: Any) -> str:
    """Compact JSON text; a lone surrogate the request brought (a model name echoed back) is
    escaped as ``\\udfff`` so that the text still encodes as UTF-8."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii() and _LONE_SURROGATE.search(text):
        return json.dumps(obj, separators=(",", ":"))
    return text


def sse_data(obj: Any) -> bytes:
    """One unnamed SSE event (`data: {...}`), as Chat / Completions streams use."""
    return f"data: {dumps(obj)}\n\n".encode()


def sse_event(name: str, obj: Any) -> bytes:
    """One named SSE event (`event: name` + `data: {...}`), as Responses / Messages use."""
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


def openai_error(
    message: str, *, type_: str = "invalid_request_error", param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _finish_reason(job: Job) -> str:
    return "length" if job.gen.finish == "length" else "stop"


def _usage(job: Job) -> dict[str, Any]:
    gen = job.gen
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.output_tokens,
        "total_tokens": gen.prompt_tokens + gen.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


# ------------------------------------------------------------------- Chat Completions


def chat_body(job: Job) -> dict[str, Any]:
    """A non-streaming `chat.completion`."""
    return {
        "id": job.id,
        "object": "chat.completion",
        "created": job.created,
        "model": job.turn.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": job.gen.text,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": _finish_reason(job),
            }
        ],
        "usage": _usage(job),
        "service_tier": "default",
        "system_fingerprint": None,
    }


async def chat_stream(job: Job) -> AsyncIterator[bytes]:
    """`chat.completion.chunk` events: role, content deltas, finish, [usage], [DONE]."""
    include_usage = job.turn.include_usage

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        choices = [] if delta is None else [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        ]
        body: dict[str, Any] = {
            "id": job.id,
            "object": "chat.completion.chunk",
            "created": job.created,
            "model": job.turn.model,
            "service_tier": "default",
            "system_fingerprint": None,
            "choices": choices,
        }
        if include_usage:  # the API sends usage: null on every chunk but the last
            body["usage"] = _usage(job) if delta is None else None
        return sse_data(body)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    async for text in job.schedule.paced(job.gen.pieces):
        yield chunk({"content": text})
    yield chunk({}, _finish_reason(job))
    if include_usage:
        yield chunk(None)
    yield DONE


# ------------------------------------------------------------- legacy Completions


def _completion(job: Job, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": job.id,
        "object": "text_completion",
        "created": job.created,
        "model": job.turn.model,
        "system_fingerprint": None,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }


def completions_body(job: Job) -> dict[str, Any]:
    """A non-streaming `text_completion`."""
    return _completion(job, job.gen.text, _finish_reason(job)) | {"usage": _usage(job)}


async def completions_stream(job: Job) -> AsyncIterator[bytes]:
    """`text_completion` chunks: text deltas, a final one with finish_reason, [usage], [DONE]."""
    async for text in job.schedule.paced(job.gen.pieces):
        yield sse_data(_completion(job, text, None))
    yield sse_data(_completion(job, "", _finish_reason(job)))
    if job.turn.include_usage:
        yield sse_data(_completion(job, "", None) | {"choices": [], "usage": _usage(job)})
    yield DONE


# ------------------------------------------------------------------------- Responses


def _responses_usage(job: Job) -> dict[str, Any]:
    gen = job.gen
    return {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": gen.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + gen.output_tokens,
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _message_item(job: Job, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": job.item_id,
        "type": "message",
        "status": status,
        "content": content,
        "role": "assistant",
    }


def _response(job: Job, status: str, output: list[dict[str, Any]] | None = None,
              usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response object in a given state (`in_progress`, `completed` or `incomplete`)."""
    return {
        "id": job.id,
        "object": "response",
        "created_at": job.created,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None,
        "incomplete_details": (
            {"reason": "max_output_tokens"} if status == "incomplete" else None
        ),
        "model": job.turn.model,
        "output": output or [],
        "service_tier": "default",
        "usage": usage,
        **job.turn.echo,
    }


def _final_status(job: Job) -> str:
    """Status of the response and of its message item once generation has ended."""
    return "incomplete" if job.gen.finish == "length" else "completed"


def responses_body(job: Job) -> dict[str, Any]:
    """A non-streaming Response object."""
    status = _final_status(job)
    item = _message_item(job, status, [_output_text(job.gen.text)])
    return _response(job, status, [item], _responses_usage(job))


def event_maker(job: Job) -> Callable[..., dict[str, Any]]:
    """Builds a stream's Responses events in order: `sequence_number` 0, 1, …, and the
    WebSocket lane (`stream_id`) on each when there is one."""
    seq = 0

    def event(type_: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        out = {"type": type_, **fields, "sequence_number": seq}
        if job.stream_id is not None:
            out["stream_id"] = job.stream_id
        seq += 1
        return out

    return event


async def responses_events(job: Job, *, generate: bool = True) -> AsyncIterator[dict[str, Any]]:
    """The Responses streaming events as dicts (shared by SSE and WebSocket mode).

    With `generate=False` (WebSocket warm-up) the response completes at once with no output.
    """
    event = event_maker(job)

    yield event("response.created", response=_response(job, "in_progress"))
    yield event("response.in_progress", response=_response(job, "in_progress"))
    if not generate:
        empty = {**_responses_usage(job), "output_tokens": 0, "total_tokens": job.gen.prompt_tokens}
        yield event("response.completed", response=_response(job, "completed", [], empty))
        return
    where = {"item_id": job.item_id, "output_index": 0, "content_index": 0}
    yield event(
        "response.output_item.added",
        output_index=0,
        item=_message_item(job, "in_progress", []),
    )
    yield event("response.content_part.added", **where, part=_output_text(""))
    async for text in job.schedule.paced(job.gen.pieces):
        yield event("response.output_text.delta", **where, delta=text, logprobs=[])
    yield event("response.output_text.done", **where, text=job.gen.text, logprobs=[])
    part = _output_text(job.gen.text)
    yield event("response.content_part.done", **where, part=part)
    status = _final_status(job)
    item = _message_item(job, status, [part])
    yield event("response.output_item.done", output_index=0, item=item)
    yield event(
        f"response.{status}",
        response=_response(job, status, [item], _responses_usage(job)),
    )


async def responses_sse(job: Job) -> AsyncIterator[bytes]:
    """The Responses events as SSE (`event:` + `data:` lines)."""
    async for event in responses_events(job):
        yield sse_event(event["type"], event)


def ws_error(message: str, param: str | None = None, code: str | None = None,
             status: int = 400) -> dict[str, Any]:
    """A Responses WebSocket `error` event (the socket stays open after it)."""
    return {
        "type": "error",
        "status": status,
        "error": {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": param,
        },
    }
