"""OpenAI Chat Completions: ``POST /v1/chat/completions``.

Streams are ``data: {chat.completion.chunk}`` events ending with ``data: [DONE]``; with
``stream_options.include_usage`` the last chunk before ``[DONE]`` has ``choices: []`` and the
usage (other chunks may carry ``usage: null``).
"""

from __future__ import annotations

from typing import Any

from .base import (
    BodyInfo,
    Classified,
    Kind,
    OpenAIChunkAdapter,
    SSEEvent,
    dumps,
    exact_obj,
)
from .checks import (
    BadRequest,
    flag,
    positive_int,
    require_list,
    require_model,
    stop_list,
    stops_or_none,
)
from .view import (
    RequestInfo,
    conversation_key,
    dicts,
    first_int,
    json_schema_of,
    loose_text,
    request_info,
    text_of_content,
    tool_spec,
)

_SYSTEM = ("system", "developer")


def last_user_text(messages: Any) -> str:
    """Text of the last ``user`` message of a messages list ('' if none)."""
    if not isinstance(messages, list):
        return ""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return text_of_content(m.get("content"))
    return ""


class ChatAdapter(OpenAIChunkAdapter):
    name = "chat"
    path = "/v1/chat/completions"

    def validate(self, body: dict[str, Any]) -> None:
        require_model(body)
        for i, message in enumerate(require_list(body, "messages")):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(
                    f"Invalid 'messages[{i}]': each message must be an object with a 'role'.",
                    param=f"messages[{i}]", code="invalid_type")
        flag(body, "stream")
        positive_int(body, "max_completion_tokens", "max_tokens")
        stop_list(body.get("stop"), "stop")

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        messages = dicts(body.get("messages"))
        system = [loose_text(m.get("content")) for m in messages if m.get("role") in _SYSTEM]
        first_user = next((loose_text(m.get("content")) for m in messages
                           if m.get("role") == "user"), "")
        rest = [m for m in messages if m.get("role") not in _SYSTEM]
        role = rest[-1].get("role") if rest else None
        ends, how = (("empty", "no_messages") if not rest
                     else ("tool_output", f"{role}_message") if role in ("tool", "function")
                     else ("assistant", "assistant_last") if role == "assistant"
                     else ("user_text", "user_message"))
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        return request_info(
            body, last_user_text(messages), ends=ends, ends_how=f"chat:{how}",
            conversation_key=conversation_key(system[0] if system else "", first_user),
            tools=tuple(tool_spec(fn["name"], fn.get("description"), fn.get("parameters"))
                        for t in dicts(body.get("tools"))
                        if t.get("type") == "function" and isinstance(fn := t.get("function"), dict)
                        and isinstance(fn.get("name"), str)),
            tool_calls_since_person=sum(1 for m in messages[last + 1:]
                                        if m.get("role") == "assistant" and m.get("tool_calls")),
            has_person=last >= 0, system_text="\n".join(system),
            max_tokens=first_int(body, "max_completion_tokens", "max_tokens"),
            stop=stops_or_none(body.get("stop")), parts=(messages,),
            schema=json_schema_of(body.get("response_format"), nested=True))

    def classify_choices(
        self, choices: list[Any], usage: dict[str, Any] | None, rid: str | None,
        obj: dict[str, Any],
    ) -> Classified:
        if len(choices) == 1:
            return self._one_choice(choices[0], usage, rid, obj)
        # n > 1: count everything, but never split (pieces would mix choices).
        texts, tools = [], 0
        for ch in choices:
            c = self._one_choice(ch, None, None, None)
            texts.append(c.text)
            tools += c.tool_calls
        text = "".join(texts)
        kind = Kind.CONTENT if text else (Kind.TOOL if tools else Kind.OTHER)
        return Classified(kind, text, None, tools, usage, rid, obj)

    def _one_choice(self, choice: Any, usage: dict[str, Any] | None, rid: str | None,
                    obj: Any) -> Classified:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            return Classified(Kind.OTHER, usage=usage, response_id=rid, obj=obj)
        content = delta.get("content")
        tool_calls = delta.get("tool_calls")
        starts = 0
        if isinstance(tool_calls, list) and tool_calls:
            starts = sum(1 for t in tool_calls if isinstance(t, dict) and t.get("id"))
        if isinstance(content, str) and content:
            return Classified(Kind.CONTENT, content, "content", starts, usage, rid, obj)
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            return Classified(Kind.CONTENT, refusal, "refusal", starts, usage, rid, obj)
        if isinstance(tool_calls, list) and tool_calls:
            args = []
            for t in tool_calls:
                fn = t.get("function") if isinstance(t, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    args.append(fn["arguments"])
            text = "".join(args)
            key = "arguments" if len(tool_calls) == 1 and text else None
            return Classified(Kind.TOOL, text, key, starts, usage, rid, obj)
        return Classified(Kind.OTHER, usage=usage, response_id=rid, obj=obj)

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        obj = exact_obj(ev, c)
        delta = obj["choices"][0]["delta"]
        if c.text_key == "arguments":
            fn = delta["tool_calls"][0]["function"]
            old = fn["arguments"]
            fn["arguments"] = piece
            out = b"data: " + dumps(obj).encode() + b"\n\n"
            fn["arguments"] = old
            return out
        old = delta[c.text_key]
        delta[c.text_key] = piece
        out = b"data: " + dumps(obj).encode() + b"\n\n"
        delta[c.text_key] = old
        return out

    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        texts, args, tools = [], [], 0
        for ch in body.get("choices") or []:
            msg = ch.get("message") if isinstance(ch, dict) else None
            if not isinstance(msg, dict):
                continue
            texts.append(text_of_content(msg.get("content")))
            if isinstance(msg.get("tool_calls"), list):
                tools += len(msg["tool_calls"])
                for call in msg["tool_calls"]:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                        args.append(fn["arguments"])
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        rid = body.get("id") if isinstance(body.get("id"), str) else None
        return BodyInfo("".join(texts), tools, usage, rid, "".join(args))
