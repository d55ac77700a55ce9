"""Anthropic Messages: ``POST /v1/messages`` (streaming and not).

Streams are named SSE events: ``message_start`` → (``content_block_start``,
``content_block_delta``*, ``content_block_stop``)* → ``message_delta`` → ``message_stop``, with
any number of ``ping`` and possibly an ``error`` event. Only ``text_delta`` deltas are answer
text (paced, split into token-sized events); a ``tool_use`` block's start and its
``input_json_delta`` deltas are tool-call events (counted, sent on arrival); thinking,
signature and citation deltas and unknown event types pass through on arrival.

Usage is the merge of ``message_start``'s ``message.usage`` (input and cache tokens) and
``message_delta``'s ``usage`` (the final output tokens); the output count of
``message_start`` (a placeholder of 1 or so) is not kept, so a stream cut before
``message_delta`` records no exact completion count.

Errors use Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``; the proxy's
own error codes map onto Anthropic's types (see :data:`ERROR_TYPES`).
"""

from __future__ import annotations

import json
from typing import Any

from .base import (
    BodyInfo,
    Classified,
    Kind,
    ProtocolAdapter,
    RequestInfo,
    SSEEvent,
    dumps,
    exact_obj,
    json_of,
    request_info,
    text_of_content,
)

__all__ = ["ERROR_TYPES", "MessagesAdapter", "anthropic_error"]

_TOOL_BLOCKS = {"tool_use", "server_tool_use", "mcp_tool_use"}

#: The proxy's error code (or OpenAI-style type) -> Anthropic's error type.
ERROR_TYPES = {
    "invalid_api_key": "authentication_error",  # 401
    "no_assignment": "permission_error",  # 403
    "consent_required": "permission_error",  # 403: no consent yet (field studies)
    "participant_withdrawn": "permission_error",  # 403
    "unknown_url": "not_found_error",  # 404
    "request_too_large": "request_too_large",  # 413
    "upstream_timeout": "timeout_error",  # 504
    "upstream_unreachable": "api_error",  # 502
    "no_upstream": "api_error",  # 501
    "recording_failed": "api_error",  # 503
    "server_error": "api_error",  # 500 and in-stream failures
    "upstream_error": "api_error",
    "invalid_request_error": "invalid_request_error",  # 400
}


def anthropic_error(message: str, type_: str = "invalid_request_error") -> bytes:
    """Anthropic's error body."""
    return dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return text_of_content(m.get("content"))
    return ""


def _sse(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: ".encode() + dumps(obj).encode() + b"\n\n"


class MessagesAdapter(ProtocolAdapter):
    name = "messages"
    path = "/v1/messages"
    family = "anthropic"

    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        return request_info(body, _last_user_text(body.get("messages")))

    def classify(self, ev: SSEEvent) -> Classified:
        obj = json_of(ev)
        if not isinstance(obj, dict):
            return Classified(Kind.OTHER, obj=obj)
        type_ = obj.get("type") or ev.name
        if type_ == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return Classified(Kind.OTHER, obj=obj)
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                if isinstance(text, str) and text:
                    return Classified(Kind.CONTENT, text, "text", obj=obj)
                return Classified(Kind.OTHER, obj=obj)
            if dtype == "input_json_delta":
                part = delta.get("partial_json")
                return Classified(Kind.TOOL, part if isinstance(part, str) else "", obj=obj)
            return Classified(Kind.OTHER, obj=obj)
        if type_ == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") in _TOOL_BLOCKS:
                return Classified(Kind.TOOL, tool_calls=1, obj=obj)
            return Classified(Kind.OTHER, obj=obj)
        if type_ == "message_start":
            msg = obj.get("message")
            rid = None
            if isinstance(msg, dict):
                rid = msg.get("id") if isinstance(msg.get("id"), str) else None
                usage = msg.get("usage")
                if isinstance(usage, dict):
                    self._usage.update({k: v for k, v in usage.items() if k != "output_tokens"})
            return Classified(Kind.OTHER, usage=dict(self._usage) or None, response_id=rid,
                              obj=obj)
        if type_ == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                # Later API versions repeat input counts here; non-null values win.
                self._usage.update({k: v for k, v in usage.items() if v is not None})
            return Classified(Kind.OTHER, usage=dict(self._usage) or None, obj=obj)
        if type_ == "message_stop":
            return Classified(Kind.TERMINAL, obj=obj)
        if type_ == "error":
            err = obj.get("error")
            msg = err.get("message") if isinstance(err, dict) else None
            return Classified(Kind.ERROR, obj=obj, error=str(msg or "error"))
        return Classified(Kind.OTHER, obj=obj)  # ping, unknown event types

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        obj = dict(exact_obj(ev, c))
        obj["delta"] = {**obj["delta"], "text": piece}
        return _sse(ev.name or "content_block_delta", obj)

    def keepalive(self) -> bytes:
        return b'event: ping\ndata: {"type": "ping"}\n\n'

    def error_event(self, message: str, type_: str = "server_error", code: str | None = None,
                    ) -> bytes:
        kind = ERROR_TYPES.get(code or "", ERROR_TYPES.get(type_, "api_error"))
        return _sse("error", {"type": "error", "error": {"type": kind, "message": message}})

    def error_body(self, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> bytes:
        kind = ERROR_TYPES.get(code or "", ERROR_TYPES.get(type_, "invalid_request_error"))
        return anthropic_error(message, kind)

    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        texts, args, tools = [], [], 0
        for block in body.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") in _TOOL_BLOCKS:
                tools += 1
                # The input as a stream's input_json_delta pieces would spell it.
                if block.get("input") is not None:
                    args.append(json.dumps(block["input"], ensure_ascii=False))
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        rid = body.get("id") if isinstance(body.get("id"), str) else None
        return BodyInfo("".join(texts), tools, usage, rid, "".join(args))
