"""Google's Gemini API wire format (bodies, ``alt=sse`` chunks, tool calls, errors, models).

A stream is ``data: {GenerateContentResponse}`` chunks (CRLF-separated, as Google's servers
write them), one per token here, with no final event: the last chunk carries
``finishReason`` and the whole ``usageMetadata``. A tool call is one ``functionCall`` part
(Gemini never streams arguments) with ``finishReason: "STOP"``. Without ``alt=sse`` the same
chunks are the elements of one JSON array (:func:`json_array`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from ..proxy.protocols.gemini import google_status
from ..tokens import count_tokens
from .generation import Job
from .openai_wire import dumps

__all__ = ["gemini_body", "gemini_error", "gemini_model", "gemini_stream",
           "gemini_tool_body", "gemini_tool_stream", "json_array"]

_FINISH = {"stop": "STOP", "stop_sequence": "STOP", "length": "MAX_TOKENS"}


def gemini_error(message: str, status: int = 400) -> dict[str, Any]:
    """Google's error body: ``{"error": {"code", "message", "status"}}``."""
    return {"error": {"code": status, "message": message, "status": google_status(status)}}


def gemini_model(model_id: str) -> dict[str, Any]:
    """One entry of ``GET /v1beta/models``."""
    return {
        "name": f"models/{model_id}", "version": "1", "displayName": model_id,
        "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent",
                                       "countTokens"],
    }


def _usage(job: Job, output: int | None) -> dict[str, Any]:
    p = job.gen.prompt_tokens
    if output is None:
        return {"promptTokenCount": p, "totalTokenCount": p}
    return {"promptTokenCount": p, "candidatesTokenCount": output,
            "totalTokenCount": p + output}


def _chunk(job: Job, parts: list[dict[str, Any]], finish: str | None,
           output: int | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": _usage(job, output),
            "modelVersion": job.turn.model, "responseId": job.id}


def _sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\r\n\r\n"


def gemini_body(job: Job) -> dict[str, Any]:
    """A whole ``generateContent`` answer."""
    gen = job.gen
    return _chunk(job, [{"text": gen.text}], _FINISH[gen.finish], gen.output_tokens)


async def gemini_stream(job: Job) -> AsyncIterator[bytes]:
    """A chunk per paced piece, each sent once the next exists (or the answer ended): the
    last carries finishReason and the whole usage, as Google's last chunk does."""
    gen = job.gen
    held: str | None = None
    async for text in job.schedule.paced(gen.pieces or ("",)):
        if held is not None:
            yield _sse(_chunk(job, [{"text": held}], None, None))
        held = text
    yield _sse(_chunk(job, [{"text": held or ""}], _FINISH[gen.finish], gen.output_tokens))


def _call_part(job: Job) -> dict[str, Any]:
    call = job.tool_call
    assert call is not None
    return {"functionCall": {"name": call.name, "args": json.loads(call.arguments)}}


def gemini_tool_body(job: Job) -> dict[str, Any]:
    assert job.tool_call is not None
    return _chunk(job, [_call_part(job)], "STOP",
                  max(1, count_tokens(job.tool_call.arguments)))


async def gemini_tool_stream(job: Job) -> AsyncIterator[bytes]:
    await job.schedule.sleep_until(job.schedule.due(0))
    yield _sse(gemini_tool_body(job))


async def json_array(sse: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The chunks of an ``alt=sse`` stream as one JSON array (the stream without ``alt``)."""
    first = True
    async for frame in sse:
        yield (b"[" if first else b",\r\n") + frame[len(b"data: "):].strip()
        first = False
    yield b"]" if not first else b"[]"
