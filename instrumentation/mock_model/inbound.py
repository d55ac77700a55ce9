"""Request bodies of the four protocols, validated and reduced to one protocol-neutral Turn.

Only what the simulated model needs is read (including which structured output, if any, is
asked for); everything else (tools, reasoning settings, tool_choice, temperature, metadata,
include, store ...) is accepted and ignored, so coding agents' large requests go through.
Bad input raises RequestError, which the caller renders in the protocol's own error shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ..tokens import count_tokens

__all__ = ["Protocol", "RequestError", "Turn", "decode_body", "parse_gemini", "parse_turn"]

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
_ANTHROPIC_ROLES = ("user", "assistant", "system")
# Keys whose values carry conversational text in any of the protocols' message shapes.
_TEXT_KEYS = ("text", "content", "output", "arguments", "input", "thinking",
              "parts", "args", "response")  # the last three: Gemini's contents


class RequestError(Exception):
    """A request the simulated model refuses, with what the error body needs."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


@dataclass
class Turn:
    """One request, protocol-neutral: what decides the answer and how it is delivered."""

    protocol: Protocol
    model: str
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


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode a JSON object body or raise a 400 RequestError."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc
    except RecursionError:
        raise RequestError("The JSON body of your request is nested too deeply.",
                           code="invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError("The request body must be a JSON object.", code="invalid_json")
    return data


def parse_turn(protocol: Protocol, data: dict[str, Any]) -> Turn:
    """Validate a decoded body of `protocol` and reduce it to a Turn."""
    try:
        return _PARSERS[protocol](data)
    except RecursionError:  # content nested deeper than the stack: the client's fault
        raise RequestError("The request is nested too deeply.", code="invalid_value") from None


# ---------------------------------------------------------------------------- helpers


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


def _joined(value: Any) -> str:
    return "\n".join(_texts(value))


def _prompt_tokens(*parts: Any, tools: Any = None) -> int:
    """Approximate prompt size: conversational text plus tool definitions, as the API counts."""
    total = sum(count_tokens(_joined(p)) for p in parts if p is not None)
    if tools:
        total += count_tokens(json.dumps(tools))
    return total


def _canonical(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _require_model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if model is None:
        raise RequestError(
            "you must provide a model parameter", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str) or not model:
        raise RequestError("model must be a non-empty string", param="model", code="invalid_type")
    return model


def _require_list(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if value is None:
        raise RequestError(
            f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
        )
    if not isinstance(value, list) or not value:
        raise RequestError(f"'{name}' must be a non-empty array.", param=name, code="invalid_type")
    return value


def _positive_int(data: dict[str, Any], *names: str) -> int | None:
    """The first of `names` present, checked to be an integer >= 1 (None if all absent)."""
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(
                f"Invalid '{name}': expected an integer >= 1, got {value!r}.",
                param=name,
                code="invalid_value",
            )
        return value
    return None


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be a boolean.", param=name, code="invalid_type")
    return value


def _stops(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError(f"'{name}' must be a string or an array of strings.", param=name)
    return tuple(s for s in value if s)


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _looks_inline(data: dict[str, Any], system_text: str, focus_text: str) -> bool:
    """Whether a chat-style request is really an inline completion (answer: bare code)."""
    if data.get("tools"):  # coding agents send tools; autocomplete never does
        return False
    if _FIM_MARKERS.search(focus_text):
        return True
    # Autocomplete system prompts are short; agents' long ones may mention completion.
    return len(system_text) < _SHORT_SYSTEM and bool(_INLINE_SYSTEM.search(system_text))


def _schema_of(spec: Any, nested: bool = False) -> dict[str, Any] | None:
    """The JSON schema a response-format spec asks for ({} for plain JSON mode), else None.

    Lenient like the rest of the parsing: an unknown or malformed spec means free text.
    `nested`: Chat Completions keeps the schema under `json_schema`, the others on the spec.
    """
    if not isinstance(spec, dict):
        return None
    kind = spec.get("type")
    if kind == "json_object":
        return {}
    if kind != "json_schema":
        return None
    holder = spec.get("json_schema") if nested else spec
    schema = holder.get("schema") if isinstance(holder, dict) else None
    return schema if isinstance(schema, dict) else {}


def _check_messages(messages: list[Any], name: str = "messages") -> None:
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                f"Invalid '{name}[{i}]': each message must be an object with a 'role'.",
                param=f"{name}[{i}]",
                code="invalid_type",
            )


def _last_user(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _joined(message.get("content"))
    return _joined(messages[-1].get("content")) if messages else ""


# ---------------------------------------------------------------------------- protocols


def _chat(data: dict[str, Any]) -> Turn:
    model = _require_model(data)
    messages = _require_list(data, "messages")
    _check_messages(messages)
    system = "\n".join(
        _joined(m.get("content")) for m in messages if m["role"] in ("system", "developer")
    )
    focus = _last_user(messages)
    return Turn(
        protocol="chat",
        model=model,
        stream=_flag(data, "stream"),
        include_usage=_include_usage(data),
        max_tokens=_positive_int(data, "max_completion_tokens", "max_tokens"),
        stop=_stops(data.get("stop"), "stop"),
        prompt_tokens=_prompt_tokens(messages, tools=data.get("tools")),
        focus_text=focus,
        key=_canonical("chat", messages),
        code_only=_looks_inline(data, system, focus),
        schema=_schema_of(data.get("response_format"), nested=True),
    )


def _completions(data: dict[str, Any]) -> Turn:
    model = _require_model(data)
    prompt = data.get("prompt")
    if prompt is None:
        raise RequestError(
            "Missing required parameter: 'prompt'.", param="prompt",
            code="missing_required_parameter",
        )
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "".join(prompt)
    if not isinstance(prompt, str):
        raise RequestError(
            "'prompt' must be a string or an array of strings.", param="prompt",
            code="invalid_type",
        )
    suffix = data.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise RequestError("'suffix' must be a string.", param="suffix", code="invalid_type")
    return Turn(
        protocol="completions",
        model=model,
        stream=_flag(data, "stream"),
        include_usage=_include_usage(data),
        max_tokens=_positive_int(data, "max_tokens"),
        stop=_stops(data.get("stop"), "stop"),
        prompt_tokens=count_tokens(prompt) + count_tokens(suffix or ""),
        # the code right around the cursor says most about the language
        focus_text=prompt[-2000:] + "\n" + (suffix or "")[:500],
        key=_canonical("completions", prompt, suffix),
        code_only=True,
    )


def _responses(data: dict[str, Any]) -> Turn:
    model = _require_model(data)
    items = data.get("input")
    instructions = data.get("instructions")
    if items is not None and not isinstance(items, str | list):
        raise RequestError("'input' must be a string or an array.", param="input")
    if instructions is not None and not isinstance(instructions, str | list):
        raise RequestError("'instructions' must be a string.", param="instructions")
    previous = data.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestError("'previous_response_id' must be a string.", param="previous_response_id")
    listed = [] if items is None else [items] if isinstance(items, str) else items
    if any(not isinstance(item, dict | str) for item in listed):
        raise RequestError("Each 'input' item must be an object.", param="input")
    user_items = [i for i in listed if isinstance(i, str) or i.get("role", "user") == "user"]
    focus = _joined(user_items[-1]) if user_items else ""
    system_items = [
        i for i in listed if isinstance(i, dict) and i.get("role") in ("system", "developer")
    ]
    system = _joined(instructions) + "\n" + _joined(system_items)
    text_config = data.get("text")
    echo = {
        "instructions": instructions,
        "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": previous,
        "reasoning": data.get("reasoning") or {"effort": None, "summary": None},
        "store": data.get("store", True),
        "temperature": data.get("temperature", 1.0),
        "text": text_config or {"format": {"type": "text"}},
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p", 1.0),
        "truncation": data.get("truncation", "disabled"),
        "metadata": data.get("metadata") or {},
        "user": data.get("user"),
        "prompt_cache_key": data.get("prompt_cache_key"),
    }
    return Turn(
        protocol="responses",
        model=model,
        stream=_flag(data, "stream"),
        max_tokens=_positive_int(data, "max_output_tokens"),
        prompt_tokens=_prompt_tokens(instructions, items, tools=data.get("tools")),
        focus_text=focus,
        # previous_response_id is part of the key so a follow-up turn gets a fresh answer
        key=_canonical("responses", instructions, items, previous),
        code_only=_looks_inline(data, system, focus),
        echo=echo,
        schema=_schema_of(text_config.get("format")) if isinstance(text_config, dict) else None,
    )


def _anthropic_common(data: dict[str, Any]) -> tuple[str, list[Any], Any]:
    if "model" not in data:
        raise RequestError("model: Field required", param="model")
    model = data["model"]
    if not isinstance(model, str) or not model:
        raise RequestError("model: Input should be a valid string", param="model")
    messages = data.get("messages")
    if messages is None:
        raise RequestError("messages: Field required", param="messages")
    if not isinstance(messages, list):
        raise RequestError("messages: Input should be a valid list", param="messages")
    for i, message in enumerate(messages):
        # "system" turns inside `messages`: Claude Code sends them (mid-conversation-system beta).
        if not isinstance(message, dict) or message.get("role") not in _ANTHROPIC_ROLES:
            raise RequestError(
                f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'",
                param="messages",
            )
    system = data.get("system")
    if system is not None and not isinstance(system, str | list):
        raise RequestError("system: Input should be a valid string or list", param="system")
    return model, messages, system


def _messages(data: dict[str, Any]) -> Turn:
    model, messages, system = _anthropic_common(data)
    if not messages:
        raise RequestError("messages: at least one message is required", param="messages")
    if "max_tokens" not in data:
        raise RequestError("max_tokens: Field required", param="max_tokens")
    max_tokens = data["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError("max_tokens: Input should be an integer >= 1", param="max_tokens")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream: Input should be a valid boolean", param="stream")
    focus = _last_user(messages)
    return Turn(
        protocol="messages",
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        stop=_stops(data.get("stop_sequences"), "stop_sequences"),
        prompt_tokens=_prompt_tokens(system, messages, tools=data.get("tools")),
        focus_text=focus,
        key=_canonical("messages", system, messages),
        code_only=_looks_inline(data, _joined(system), focus),
        schema=_messages_schema(data),
    )


def _messages_schema(data: dict[str, Any]) -> dict[str, Any] | None:
    config = data.get("output_config")
    spec = config.get("format") if isinstance(config, dict) else None
    # `output_format` is the earlier (beta) spelling of the same parameter.
    return _schema_of(spec if spec is not None else data.get("output_format"))


def _count_tokens(data: dict[str, Any]) -> Turn:
    model, messages, system = _anthropic_common(data)
    return Turn(
        protocol="count_tokens",
        model=model,
        prompt_tokens=_prompt_tokens(system, messages, tools=data.get("tools")),
    )


_PARSERS = {
    "chat": _chat,
    "completions": _completions,
    "responses": _responses,
    "messages": _messages,
    "count_tokens": _count_tokens,
}


def parse_gemini(data: dict[str, Any], model: str, method: str) -> Turn:
    """Validate a Gemini request (the model and the method are in its URL) and reduce it to a
    Turn; its reading is the protocol module's
    (:class:`~flowtrial.instrumentation.proxy.protocols.gemini.GeminiAdapter`)."""
    from ..proxy.protocols import read_view

    contents = data.get("contents")
    if not isinstance(contents, list) or not contents or not all(
            isinstance(c, dict) and isinstance(c.get("parts"), list) for c in contents):
        raise RequestError("* GenerateContentRequest.contents: contents is not specified"
                           if not contents else "Invalid JSON payload: each content needs "
                           "'parts' (a list)", param="contents")
    view = read_view("gemini", data, {"model": model, "method": method})
    system = data.get("systemInstruction") or data.get("system_instruction")
    config = data.get("generationConfig")
    schema = None
    if isinstance(config, dict) and config.get("responseMimeType") == "application/json":
        spec = config.get("responseJsonSchema", config.get("responseSchema"))
        schema = spec if isinstance(spec, dict) else {}
    return Turn(
        protocol="gemini_count" if method == "countTokens" else "gemini",
        model=model,
        stream=view.stream,
        max_tokens=view.max_tokens if view.max_tokens and view.max_tokens > 0 else None,
        prompt_tokens=_prompt_tokens(system, contents, tools=data.get("tools")),
        focus_text=view.prompt_text,
        key=_canonical("gemini", system, contents),
        code_only=_looks_inline(data, _joined(system), view.prompt_text),
        schema=schema,
    )
