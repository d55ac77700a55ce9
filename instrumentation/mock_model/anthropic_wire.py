"""Anthropic Messages wire format (bodies, named SSE events, error shape)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .generation import Job
from .openai_wire import sse_event

__all__ = ["anthropic_error", "messages_body", "messages_stream"]

_STOP_REASON = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens"}
_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
}


def anthropic_error(message: str, status: int = 400) -> dict[str, Any]:
    """The Anthropic error body: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ERROR_TYPE.get(status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _usage(job: Job, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": job.gen.prompt_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _message(job: Job, content: list[dict[str, Any]], stop_reason: str | None,
             stop_sequence: str | None, output_tokens: int) -> dict[str, Any]:
    return {
        "id": job.id,
        "type": "message",
        "role": "assistant",
        "model": job.turn.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(job, output_tokens),
    }


def messages_body(job: Job) -> dict[str, Any]:
    """A non-streaming `message`."""
    gen = job.gen
    return _message(
        job,
        [{"type": "text", "text": gen.text}],
        _STOP_REASON[gen.finish],
        gen.stop_sequence,
        gen.output_tokens,
    )


async def messages_stream(job: Job) -> AsyncIterator[bytes]:
    """message_start, content_block_start, ping, text deltas, block stop, message_delta/stop."""
    gen = job.gen
    # The API reports a token or so of output already at message_start.
    yield sse_event("message_start", {
        "type": "message_start", "message": _message(job, [], None, None, 1),
    })
    yield sse_event("content_block_start", {
        "type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""},
    })
    yield sse_event("ping", {"type": "ping"})
    async for text in job.schedule.paced(gen.pieces):
        yield sse_event("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text},
        })
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield sse_event("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": _STOP_REASON[gen.finish], "stop_sequence": gen.stop_sequence},
        "usage": {"output_tokens": gen.output_tokens},
    })
    yield sse_event("message_stop", {"type": "message_stop"})
