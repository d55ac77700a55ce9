"""MockModel: the built-in simulated upstream, usable in-process (no HTTP) or behind app.py."""

from __future__ import annotations

import math
import random
import re
import string
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..proxy.protocols.responses import WS_ENVELOPE
from ..tokens import split_tokens
from .anthropic_wire import (
    anthropic_error,
    messages_body,
    messages_stream,
)
from .corpus import load_corpus
from .gemini_wire import (
    gemini_body,
    gemini_error,
    gemini_model,
    gemini_stream,
    gemini_tool_body,
    gemini_tool_stream,
    json_array,
)
from .generation import Generation, Job, Schedule, generate
from .inbound import BadRequest, Protocol, Turn, decode_json, read_turn
from .openai_wire import (
    chat_body,
    chat_stream,
    completions_body,
    completions_stream,
    dumps,
    openai_error,
    responses_body,
    responses_events,
    responses_sse,
    sse_event,
    ws_error,
)
from .script import scripted_answer
from .tool_steps import ToolCall, ToolPlanner
from .tool_wire import (
    chat_tool_body,
    chat_tool_stream,
    messages_tool_body,
    messages_tool_stream,
    responses_tool_body,
    responses_tool_events,
)

__all__ = ["CYCLE_ID_HEADER", "MODEL_IDS", "MockModel", "MockReply"]

MODEL_IDS = ("flowtrial-sim-1", "flowtrial-sim-1-mini", "flowtrial-sim-code-1")
CYCLE_ID_HEADER = "x-flowtrial-cycle-id"
_MODELS_CREATED = 1735689600  # 2025-01-01T00:00:00Z: fixed so the model list is stable
_ROUTES: dict[str, Protocol] = {
    "chat/completions": "chat",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
    "messages/count_tokens": "count_tokens",
}
_ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "messages": "msg_",
              "gemini": ""}
_STREAMS = {
    "chat": chat_stream,
    "completions": completions_stream,
    "responses": responses_sse,
    "messages": messages_stream,
}
_BODIES = {
    "chat": chat_body,
    "completions": completions_body,
    "responses": responses_body,
    "messages": messages_body,
}
_TOOL_STREAMS = {"chat": chat_tool_stream, "messages": messages_tool_stream}
_TOOL_BODIES = {"chat": chat_tool_body, "responses": responses_tool_body,
                "messages": messages_tool_body}
_CYCLE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_ALNUM = string.ascii_letters + string.digits
_JSON = "application/json"
_SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


@dataclass
class MockReply:
    """An HTTP reply: status, headers (at least content-type) and the body as wire bytes.

    For streams the body is paced in real time: iterate it as the bytes should be sent.
    """

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]

    async def read(self) -> bytes:
        """Collect the whole body (waits for a stream to finish)."""
        return b"".join([chunk async for chunk in self.body])


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _route(path: str) -> str:
    """Normalize a request path: no query, no surrounding slashes, no leading `v1/`."""
    path = path.split("?", 1)[0].strip("/")
    return path[3:] if path.startswith("v1/") else "" if path == "v1" else path


class MockModel:
    """A simulated model speaking the OpenAI and Anthropic wire protocols, offline.

    Answers are drawn from a shipped corpus of code answers, deterministically for a seed and
    request; the first content token comes after `ttft_ms` and the rest at
    `tokens_per_second` (`math.inf` sends everything at once after the TTFT).
    With `tool_steps` N > 0, a request offering tools is answered with a call to a harmless
    offered tool for the first N steps of the person's turn (tool_steps.py).
    With `answer_tokens` (lo, hi), every prose answer is N tokens long, N drawn per request
    from [lo, hi] (long answers for fast arms).
    """

    def __init__(
        self, tokens_per_second: float = 2000.0, ttft_ms: float = 20.0, seed: int = 0,
        tool_steps: int = 0, answer_tokens: tuple[int, int] | None = None,
        script: tuple[str, ...] = (),
    ) -> None:
        if not tokens_per_second > 0:
            raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second}")
        if not (ttft_ms >= 0 and math.isfinite(ttft_ms)):
            raise ValueError(f"ttft_ms must be a finite number >= 0, got {ttft_ms}")
        self.tokens_per_second = float(tokens_per_second)
        self.ttft_ms = float(ttft_ms)
        if answer_tokens is not None and not 1 <= answer_tokens[0] <= answer_tokens[1]:
            raise ValueError(f"answer_tokens must be (lo, hi) with 1 <= lo <= hi, "
                             f"got {answer_tokens}")
        self.seed = seed
        self.answer_tokens = answer_tokens
        self.tools = ToolPlanner(tool_steps, seed)
        self.script = tuple(script)  # scripted text answers (script.py)
        self._corpus = load_corpus()
        # Ids come from their own seeded stream: unique per reply, reproducible per run,
        # and independent of the answer text (which depends on the request only).
        self._ids = random.Random(f"flowtrial-ids/{seed}")

    # ------------------------------------------------------------------ public API

    def models(self) -> dict[str, Any]:
        """Body of `GET /v1/models`: the OpenAI list shape, also readable by Anthropic's SDK."""
        data = [self._model_entry(model_id) for model_id in MODEL_IDS]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }

    async def respond(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> MockReply:
        """Answer one HTTP request (any of the supported paths, with or without `/v1`)."""
        start = time.monotonic()
        method = method.upper()
        route = _route(path)
        if route.startswith("v1beta/"):
            return await self._gemini(method, route[7:], path, headers, body, start)
        if route.startswith("models/") and ":" in route:  # Gemini's v1 (model in the URL)
            return await self._gemini(method, route, path, headers, body, start)
        if route == "models" or route.startswith("models/"):
            if method != "GET":
                return _error(None, BadRequest(f"Invalid method for URL ({method} {path})", 405))
            entry = self.models() if route == "models" else self._model_entry(route[7:])
            return _json(200, entry)
        protocol = _ROUTES.get(route)
        if protocol is None:
            return _error(None, BadRequest(f"Invalid URL ({method} {path})", 404))
        if method != "POST":
            return _error(protocol, BadRequest(f"Invalid method for URL ({method} {path})", 405))
        try:
            data = decode_json(body)
            turn = read_turn(protocol, data)
        except BadRequest as exc:
            return _error(protocol, exc)
        if protocol == "count_tokens":
            return _json(200, {"input_tokens": turn.prompt_tokens})

        call = self.tools.plan(protocol, data, turn.view)
        job = self._job(turn, {k.lower(): v for k, v in headers.items()}, start, tool_call=call,
                        text=scripted_answer(self.script, protocol, data))
        if protocol == "responses":
            self.tools.answered(job.id, call)
        if call is not None:
            if turn.stream:
                stream = (_TOOL_STREAMS[protocol](job) if protocol != "responses"
                          else _sse_of(responses_tool_events(job)))
                return MockReply(200, {**_SSE, **self._request_id(protocol)}, stream)
            await job.schedule.sleep_until(job.schedule.due(0))
            return _json(200, _TOOL_BODIES[protocol](job), self._request_id(protocol))
        if turn.stream:
            return MockReply(200, {**_SSE, **self._request_id(protocol)}, _STREAMS[protocol](job))
        # Non-streaming: the whole answer exists only once its last token is generated.
        await job.schedule.sleep_until(job.schedule.due(max(0, job.gen.output_tokens - 1)))
        return _json(200, _BODIES[protocol](job), self._request_id(protocol))

    async def respond_ws(
        self, message: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Responses WebSocket mode: one `response.create` message in, its events out.

        An invalid message yields a single `error` event (the connection can go on).
        """
        start = time.monotonic()
        if not isinstance(message, dict) or message.get("type") != "response.create":
            kind = message.get("type") if isinstance(message, dict) else type(message).__name__
            yield ws_error(f"Unsupported event type {kind!r}: send 'response.create'.", "type")
            return
        generate_flag = message.get("generate", True)
        stream_id = message.get("stream_id")
        if not isinstance(generate_flag, bool):
            yield ws_error("'generate' must be a boolean.", "generate")
            return
        if stream_id is not None and not isinstance(stream_id, str):
            yield ws_error("'stream_id' must be a string.", "stream_id")
            return
        body = {k: v for k, v in message.items() if k not in WS_ENVELOPE}
        try:
            turn = read_turn("responses", body)
        except BadRequest as exc:
            yield ws_error(exc.message, exc.param, exc.code, exc.status)
            return
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        call = self.tools.plan("responses", body, turn.view) if generate_flag else None
        job = self._job(turn, lowered, start, stream_id, tool_call=call,
                        text=scripted_answer(self.script, "responses", body))
        if generate_flag:
            self.tools.answered(job.id, call)
        events = (responses_tool_events(job) if call is not None
                  else responses_events(job, generate=generate_flag))
        async for event in events:
            yield event

    async def _gemini(self, method: str, route: str, path: str, headers: Mapping[str, str],
                      body: bytes, start: float) -> MockReply:
        """Google's Gemini API: ``models``, ``models/<m>:generateContent`` |
        ``:streamGenerateContent`` (``?alt=sse`` or the JSON array) | ``:countTokens``."""
        if route == "models":
            if method != "GET":
                return _gemini_error(BadRequest(f"Invalid method ({method} {path})", 405))
            return _json(200, {"models": [gemini_model(m) for m in MODEL_IDS]})
        model, _, verb = route.removeprefix("models/").partition(":")
        if not model or verb not in ("generateContent", "streamGenerateContent", "countTokens"):
            return _gemini_error(BadRequest(f"Invalid URL ({method} {path})", 404))
        if method != "POST":
            return _gemini_error(BadRequest(f"Invalid method ({method} {path})", 405))
        try:
            data = decode_json(body)
            turn = read_turn("gemini_count" if verb == "countTokens" else "gemini", data,
                             {"model": model, "method": verb})
        except BadRequest as exc:
            return _gemini_error(exc)
        if verb == "countTokens":
            return _json(200, {"totalTokens": turn.prompt_tokens})
        call = self.tools.plan("gemini", data, turn.view)
        job = self._job(turn, {k.lower(): v for k, v in headers.items()}, start, tool_call=call,
                        text=scripted_answer(self.script, "gemini", data))
        if not turn.stream:
            if call is not None:
                await job.schedule.sleep_until(job.schedule.due(0))
                return _json(200, gemini_tool_body(job))
            await job.schedule.sleep_until(job.schedule.due(max(0, job.gen.output_tokens - 1)))
            return _json(200, gemini_body(job))
        stream = gemini_tool_stream(job) if call is not None else gemini_stream(job)
        if "alt=sse" in path.partition("?")[2]:
            return MockReply(200, dict(_SSE), stream)
        return MockReply(200, {"content-type": _JSON}, json_array(stream))

    # ------------------------------------------------------------------ helpers

    def _model_entry(self, model_id: str) -> dict[str, Any]:
        # OpenAI fields plus Anthropic's (type, display_name, created_at), so both SDKs parse it.
        return {
            "id": model_id,
            "object": "model",
            "created": _MODELS_CREATED,
            "owned_by": "flowtrial",
            "type": "model",
            "display_name": model_id.replace("-", " ").title(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_MODELS_CREATED)),
        }

    def _random_id(self, protocol: Protocol) -> str:
        if protocol == "responses":
            return "".join(self._ids.choice("0123456789abcdef") for _ in range(48))
        if protocol == "messages":
            return "01" + "".join(self._ids.choice(_ALNUM) for _ in range(22))
        return "".join(self._ids.choice(_ALNUM) for _ in range(29))

    def _job(self, turn: Turn, headers: Mapping[str, str], start: float,
             stream_id: str | None = None, tool_call: ToolCall | None = None,
             text: str | None = None) -> Job:
        gen = generate(turn, self._corpus, self.seed, self.answer_tokens)
        if text is not None and turn.schema is None:  # a scripted answer (script.py)
            gen = Generation(text, tuple(split_tokens(text)), "stop", None, turn.prompt_tokens)
        cycle = headers.get(CYCLE_ID_HEADER, "")
        # The proxy passes its cycle id so clients see it in the response id.
        suffix = cycle if _CYCLE_ID.fullmatch(cycle) else self._random_id(turn.protocol)
        item_id = "msg_" + self._random_id("responses") if turn.protocol == "responses" else ""
        schedule = Schedule(start, self.ttft_ms / 1000.0, self.tokens_per_second)
        return Job(turn, gen, _ID_PREFIX[turn.protocol] + suffix, int(time.time()), schedule,
                   item_id, stream_id, tool_call)

    def _request_id(self, protocol: Protocol) -> dict[str, str]:
        request_id = "req_" + "".join(self._ids.choice(_ALNUM) for _ in range(24))
        if protocol in ("messages", "count_tokens"):
            return {"request-id": request_id}
        return {"x-request-id": request_id}


async def _sse_of(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for event in events:
        yield sse_event(event["type"], event)


def _json(status: int, obj: Any, headers: dict[str, str] | None = None) -> MockReply:
    data = dumps(obj).encode()
    head = {"content-type": _JSON, "content-length": str(len(data)), **(headers or {})}
    return MockReply(status, head, _once(data))


def _gemini_error(exc: BadRequest) -> MockReply:
    return _json(exc.status, gemini_error(exc.message, exc.status))


def _error(protocol: Protocol | None, exc: BadRequest) -> MockReply:
    """Render a BadRequest in the error shape of the protocol asked (OpenAI's by default)."""
    if protocol in ("messages", "count_tokens"):
        return _json(exc.status, anthropic_error(exc.message, exc.status))
    return _json(exc.status, openai_error(exc.message, param=exc.param, code=exc.code))
