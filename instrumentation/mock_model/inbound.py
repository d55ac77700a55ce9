"""The simulated model's reading of a request: its protocol module's view, plus what only a
simulated model needs from that view (the prompt's size, which answer to draw, whether it is
an inline completion that gets bare code back).

Parsing and checking belong to the protocol modules (``proxy/protocols/``): this module reads
no request field of its own, except the Responses fields a Responses server echoes back.
A body the protocol refuses raises :class:`BadRequest`, which the caller renders in the
protocol's own error shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ..proxy.protocols import BadRequest, RequestInfo, decode_json, read_checked
from ..tokens import count_tokens

__all__ = ["BadRequest", "Protocol", "Turn", "decode_json", "read_turn"]

Protocol = Literal["chat", "completions", "responses", "messages", "count_tokens", "gemini",
                   "gemini_count"]

# Marker tokens of fill-in-the-middle prompts (StarCoder, CodeLlama, DeepSeek, Qwen, Continue)
# and phrases of autocomplete system prompts: such requests get bare code back.
_FIM_MARKERS = re.compile(
    r"<\|?fim[_▁-]?(?:prefix|suffix|middle|begin|hole|end)\|?>|<PRE>|<SUF>|<MID>"
    r"|\{\{FILL_HERE\}\}|<FILL_ME>|<\|?cursor\|?>|<CURSOR>",
    re.IGNORECASE,
)
_INLINE_SYSTEM = re.compile(
    r"autocomplet|fill[- ]in[- ]the[- ]middle|inline (?:code )?completion|code completion"
    r"|complete the code|only (?:output|return|respond with) (?:the )?code",
    re.IGNORECASE,
)
_SHORT_SYSTEM = 4000  # characters
_FOCUS = 2500  # characters of a completion prompt (around the cursor) that steer the language
# Keys whose values carry conversational text in any of the protocols' message shapes.
_TEXT_KEYS = ("text", "content", "output", "arguments", "input", "thinking",
              "parts", "args", "response")  # the last three: Gemini's contents
#: The simulated model's protocol name -> (protocol module, its method in the URL).
_MODULE: dict[str, tuple[str, str | None]] = {
    "count_tokens": ("messages", "count_tokens"), "gemini_count": ("gemini", "countTokens")}


@dataclass
class Turn:
    """One request, protocol-neutral: what decides the answer and how it is delivered."""

    protocol: Protocol
    model: str
    view: RequestInfo
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    prompt_tokens: int = 0
    focus_text: str = ""  # the latest user input: steers the choice of language
    key: str = ""  # canonical request content: seeds the per-request RNG
    code_only: bool = False
    echo: dict[str, Any] = field(default_factory=dict)  # Responses fields echoed back
    # Structured output asked for: a JSON schema ({} = any JSON object), None = free text.
    schema: dict[str, Any] | None = None


def read_turn(protocol: Protocol, data: dict[str, Any],
              url_params: dict[str, str] | None = None) -> Turn:
    """The Turn of a decoded body of ``protocol`` (``url_params``: Gemini's model and
    method); a body the protocol refuses raises :class:`BadRequest`."""
    module, method = _MODULE.get(protocol, (protocol, None))
    params = dict(url_params or {})
    if method is not None:
        params["method"] = method
    view = read_checked(module, data, params)
    focus = view.prompt_text[-_FOCUS:] if protocol == "completions" else view.prompt_text
    model = view.model or params.get("model", "")
    previous = (view.previous_response_id,) if protocol == "responses" else ()
    limit = view.max_tokens
    return Turn(
        protocol=protocol,
        model=model,
        view=view,
        stream=view.stream,
        include_usage=view.include_usage,
        max_tokens=limit if limit is not None and limit > 0 else None,
        stop=view.stop,
        prompt_tokens=_prompt_tokens(view),
        focus_text=focus,
        # previous_response_id is part of the key so a follow-up turn gets a fresh answer
        key=_canonical(module, *view.parts, *previous),
        code_only=protocol == "completions" or _looks_inline(view, focus),
        echo=_responses_echo(data) if protocol == "responses" else {},
        schema=view.schema,
    )


def _texts(value: Any) -> list[str]:
    """Every piece of conversational text inside a message structure."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        out: list[str] = []
        for key in _TEXT_KEYS:
            inner = value.get(key)
            if isinstance(inner, dict):  # tool arguments given as an object
                out.append(json.dumps(inner, sort_keys=True))
            elif inner is not None:
                out.extend(_texts(inner))
        return out
    return []


def _prompt_tokens(view: RequestInfo) -> int:
    """Approximate prompt size: conversational text plus tool definitions, as the API counts."""
    total = sum(count_tokens("\n".join(_texts(p))) for p in view.parts if p is not None)
    if view.tool_defs:
        total += count_tokens(json.dumps(view.tool_defs))
    return total


def _canonical(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _looks_inline(view: RequestInfo, focus: str) -> bool:
    """Whether a chat-style request is really an inline completion (answer: bare code)."""
    if view.offers_tools:  # coding agents send tools; autocomplete never does
        return False
    if _FIM_MARKERS.search(focus):
        return True
    # Autocomplete system prompts are short; agents' long ones may mention completion.
    system = view.system_text
    return len(system) < _SHORT_SYSTEM and bool(_INLINE_SYSTEM.search(system))


def _responses_echo(data: dict[str, Any]) -> dict[str, Any]:
    """The request fields a Responses server echoes in its response object (copied back as
    sent, with the API's defaults for absent ones)."""
    return {
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "reasoning": data.get("reasoning") or {"effort": None, "summary": None},
        "store": data.get("store", True),
        "temperature": data.get("temperature", 1.0),
        "text": data.get("text") or {"format": {"type": "text"}},
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p", 1.0),
        "truncation": data.get("truncation", "disabled"),
        "metadata": data.get("metadata") or {},
        "user": data.get("user"),
        "prompt_cache_key": data.get("prompt_cache_key"),
    }
