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
    Family,
    Kind,
    ProtocolAdapter,
    SSEEvent,
    dumps,
    exact_obj,
    json_of,
)
from .checks import BadRequest, stop_list, stops_or_none
from .view import (
    RequestInfo,
    conversation_key,
    dicts,
    json_schema_of,
    loose_text,
    request_info,
    text_of_content,
    tool_spec,
)

__all__ = ["ANTHROPIC", "ANTHROPIC_VERSION", "ERROR_TYPES", "MessagesAdapter", "anthropic_error"]

ANTHROPIC_VERSION = "2023-06-01"  # sent when the client sent no ``anthropic-version``
ANTHROPIC = Family("anthropic", "x-api-key",
                   default_headers=(("anthropic-version", ANTHROPIC_VERSION),))

_TOOL_BLOCKS = {"tool_use", "server_tool_use", "mcp_tool_use"}
# "system" turns inside `messages`: Claude Code sends them (mid-conversation-system beta).
_ROLES = ("user", "assistant", "system")
_RESULT_BLOCKS = ("tool_result", "mcp_tool_result")


def _has_block(message: dict[str, Any], types: tuple[str, ...]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in types for b in content)

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
    family = ANTHROPIC
    name = "messages"
    path = "/v1/messages"
    error_prefixes = ("/v1/messages",)

    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}

    def validate(self, body: dict[str, Any]) -> None:
        """Anthropic's checks (its pydantic-style messages); ``count_tokens`` (the method of
        ``/v1/messages/count_tokens``) needs neither messages nor ``max_tokens``."""
        if "model" not in body:
            raise BadRequest("model: Field required", param="model")
        if not isinstance(body["model"], str) or not body["model"]:
            raise BadRequest("model: Input should be a valid string", param="model")
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("messages: Field required", param="messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: Input should be a valid list", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in _ROLES:
                raise BadRequest(f"messages.{i}.role: Input should be 'user', 'assistant' or "
                                 "'system'", param="messages")
        if body.get("system") is not None and not isinstance(body["system"], str | list):
            raise BadRequest("system: Input should be a valid string or list", param="system")
        if self.url_params.get("method") == "count_tokens":
            return
        if not messages:
            raise BadRequest("messages: at least one message is required", param="messages")
        if "max_tokens" not in body:
            raise BadRequest("max_tokens: Field required", param="max_tokens")
        limit = body["max_tokens"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise BadRequest("max_tokens: Input should be an integer >= 1", param="max_tokens")
        if not isinstance(body.get("stream", False), bool):
            raise BadRequest("stream: Input should be a valid boolean", param="stream")
        stop_list(body.get("stop_sequences"), "stop_sequences")

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        messages = dicts(body.get("messages"))
        first_user = next((loose_text(m.get("content")) for m in messages
                           if m.get("role") == "user"), "")
        # Claude Code appends mid-conversation "system" messages after the user's.
        rest = [m for m in messages if m.get("role") != "system"]
        if not rest:
            ends, how = "empty", "no_messages"
        elif rest[-1].get("role") == "assistant":
            ends, how = "assistant", "assistant_last"
        elif _has_block(rest[-1], _RESULT_BLOCKS):
            # Tool results, possibly with reminders the client added as text: a continuation.
            ends, how = "tool_output", "tool_result"
        else:
            ends, how = "user_text", "user_message"
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"
                    and not _has_block(m, ("tool_result",))), default=-1)
        config = body.get("output_config")
        spec = config.get("format") if isinstance(config, dict) else None
        # `output_format` is the earlier (beta) spelling of the same parameter.
        spec = body.get("output_format") if spec is None else spec
        system = loose_text(body.get("system"))
        return request_info(
            body, _last_user_text(body.get("messages")), ends=ends, ends_how=f"messages:{how}",
            conversation_key=conversation_key(system, first_user),
            tools=tuple(tool_spec(t["name"], t.get("description"), t.get("input_schema"))
                        for t in dicts(body.get("tools"))
                        if isinstance(t.get("name"), str) and "input_schema" in t),
            tool_calls_since_person=sum(1 for m in messages[last + 1:]
                                        if m.get("role") == "assistant"
                                        and _has_block(m, ("tool_use",))),
            has_person=last >= 0, system_text=system,
            stop=stops_or_none(body.get("stop_sequences")),
            parts=(body.get("system"), body.get("messages")),
            schema=json_schema_of(spec))

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
