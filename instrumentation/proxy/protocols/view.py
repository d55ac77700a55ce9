"""The request view: one request of any protocol, read once by its protocol module.

Every reader shares it: the relay (stream flag, model), the request classifier
(``turns/classify.py``) and the simulated model (``mock_model/inbound.py``: its size, its
answer's seed, inline completions, structured output, stop sequences, tool steps). The
helpers here are what several protocol modules use to fill it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

__all__ = ["Ends", "RequestInfo", "ToolSpec", "conversation_key", "dicts", "first_int",
           "json_schema_of", "loose_text", "request_info", "text_of_content", "tool_spec"]


Ends = Literal["user_text", "tool_output", "assistant", "empty"]


class ToolSpec(NamedTuple):
    """One function tool a request offers."""

    name: str
    description: str
    schema: dict[str, Any]


def tool_spec(name: str, description: Any, schema: Any) -> ToolSpec:
    """A :class:`ToolSpec` from a protocol's fields (a bad description or schema reads as
    empty)."""
    return ToolSpec(name, description if isinstance(description, str) else "",
                    schema if isinstance(schema, dict) else {})


@dataclass(slots=True)
class RequestInfo:
    """One request, read once by its protocol module into the view every reader shares: the
    relay (stream flag, model), the request classifier (``turns/classify.py``: what the input
    ends with, tools, conversation) and the simulated model's tool steps (tools offered, tool
    calls since the person's last message). Tolerant: a field of the wrong shape reads as
    absent (classification runs before the upstream sees the body). A server of the protocol
    (the simulated model) checks the body first (``validate``, :mod:`.checks`)."""

    stream: bool
    model: str | None
    prompt_text: str
    ends: Ends = "user_text"  # what the input ends with (the person's text, tool output …)
    ends_how: str = ""  # the wire-level reason (``chat:tool_message`` …)
    conversation_key: str | None = None  # hash of the system prompt and first user text
    offers_tools: bool = False
    #: Each function tool offered: name, description, JSON schema of its arguments.
    tools: tuple[ToolSpec, ...] = ()
    tool_calls_since_person: int = 0  # model tool calls after the person's last message
    has_person: bool = True  # the input holds a message from the person at all
    max_tokens: int | None = None
    structured: bool = False  # asks for JSON (schema) output
    previous_response_id: str | None = None
    # What a server of the protocol (the simulated model) needs beyond that:
    system_text: str = ""  # the system prompt / instructions as text
    stop: tuple[str, ...] = ()  # stop sequences asked for
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    #: The JSON schema structured output asks for ({} = any JSON object); None: free text.
    schema: dict[str, Any] | None = None
    #: The conversation as sent (system, messages / input / contents), for its size and hash.
    parts: tuple[Any, ...] = ()
    tool_defs: Any = None  # the ``tools`` field as sent (counted in the prompt's size)


def dicts(items: Any) -> list[dict[str, Any]]:
    """The objects of a list field; any other shape (a number, a string, null) reads as
    empty."""
    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def loose_text(content: Any) -> str:
    """All text of a content value of any protocol (strings, parts, nested ``text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(loose_text(part) for part in content)
    if isinstance(content, dict):
        for key in ("text", "content"):
            if key in content:
                return loose_text(content[key])
    return ""


def conversation_key(*parts: str) -> str | None:
    """The conversation identity: a short hash of its fixed parts (None if all empty)."""
    if not any(parts):
        return None
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()


def first_int(body: dict[str, Any], *names: str) -> int | None:
    return next((v for k in names if isinstance(v := body.get(k), int)
                 and not isinstance(v, bool)), None)


def json_schema_of(spec: Any, nested: bool = False) -> dict[str, Any] | None:
    """The JSON schema a response-format spec asks for ({} for plain JSON mode), else None;
    an unknown or malformed spec means free text. ``nested``: Chat Completions keeps the
    schema under ``json_schema``, the others on the spec itself."""
    if not isinstance(spec, dict) or spec.get("type") not in ("json_schema", "json_object"):
        return None
    holder = spec.get("json_schema") if nested else spec
    schema = holder.get("schema") if isinstance(holder, dict) else None
    return schema if isinstance(schema, dict) and spec["type"] == "json_schema" else {}


def request_info(body: dict[str, Any], prompt_text: str, **fields: Any) -> RequestInfo:
    """What every protocol reads of a request (the stream flag, the model, the prompt text,
    the tools, the token limit) plus the protocol's own ``fields``."""
    model = body.get("model")
    tools = body.get("tools")
    fields.setdefault("max_tokens", first_int(
        body, "max_tokens", "max_completion_tokens", "max_output_tokens"))
    fields.setdefault("structured", fields.get("schema") is not None)
    options = body.get("stream_options")
    return RequestInfo(
        stream=body.get("stream") is True,
        model=model if isinstance(model, str) else None,
        prompt_text=prompt_text,
        offers_tools=bool(tools) and isinstance(tools, list),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        tool_defs=tools,
        **fields,
    )


def text_of_content(content: Any) -> str:
    """Text of a message's content: a string, or a list of text parts of any protocol."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""
