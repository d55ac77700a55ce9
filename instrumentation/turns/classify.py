"""Classifying a model request: ``human`` / ``continuation`` / ``side`` / ``retry``.

Pure functions, no I/O: :func:`features` reads what the rules need from a request body
(what it ends with, whether it offers tools, its conversation), :func:`classify` runs the
rules in :data:`RULES` in order against the features and a :class:`Context` (what the
participant's recent traffic looks like) and returns the first that matches, by name. The
rules are data (a name, a kind, a predicate) so they can be listed, documented and tested
one by one (docs/concepts/turns.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .clients import client_name
from .followups import faster_than_typing

__all__ = [
    "RULES",
    "Context",
    "Features",
    "Rule",
    "classify",
    "client_name",
    "features",
]

Ends = Literal["user_text", "tool_output", "assistant", "empty"]
_SYSTEM_ROLES = ("system", "developer")
_TOOL_RESULT_ITEMS = ("function_call_output", "custom_tool_call_output",
                      "local_shell_call_output", "computer_call_output", "mcp_approval_response")


@dataclass(frozen=True)
class Features:
    """What the rules read of one request."""

    protocol: str
    ends: Ends  # what the request's input ends with (the person's text, tool output ...)
    ends_how: str  # the wire-level reason (``chat:tool_message``, ``messages:tool_result`` …)
    offers_tools: bool
    model: str | None
    conversation_key: str | None
    max_tokens: int | None = None
    structured: bool = False  # asks for JSON (schema) output
    previous_response_id: str | None = None


@dataclass(frozen=True)
class Context:
    """The participant's recent traffic, as far as the rules look at it."""

    repeat: bool = False  # the same request came within the retry window
    turn_open: bool = False  # a turn is waiting for its final answer
    turn_conversation: str | None = None  # the latest turn's conversation key
    turn_model: str | None = None
    turn_offers_tools: bool = False
    turn_client: str | None = None
    client: str | None = None  # this request's client (the agent's name)
    #: Seconds since this conversation's previous answer ended well (None: no such answer
    #: within the idle limit), the typing-speed window, and whether the person showed they
    #: acted since that answer (docs/concepts/turns.md#the-typing-speed-rule).
    since_answer_s: float | None = None
    typing_window_s: float = 0.0
    person_acted: bool = False


Predicate = Callable[[Features, Context], bool]


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    applies: Predicate
    doc: str


def _other_conversation(f: Features, c: Context) -> bool:
    return c.turn_conversation is not None and f.conversation_key != c.turn_conversation


#: The rules, first match wins; a request none matches is ``human`` (rule ``new_input``).
RULES: tuple[Rule, ...] = (
    Rule("completions", "human", lambda f, c: f.protocol == "completions",
         "inline / FIM completions: every request is the person's"),
    Rule("identical_request", "retry", lambda f, c: c.repeat,
         "the same request body within the retry window: the client re-asked"),
    Rule("tool_output", "continuation", lambda f, c: f.ends == "tool_output",
         "the input ends with tool results (chat role tool, Messages tool_result, Responses "
         "function_call_output / custom_tool_call_output)"),
    Rule("probe", "side", lambda f, c: f.max_tokens is not None and f.max_tokens <= 1,
         "max_tokens <= 1: a quota or reachability probe, nothing to read"),
    Rule("faster_than_typing", "continuation",
         lambda f, c: f.ends == "user_text" and faster_than_typing(
             c.since_answer_s, c.typing_window_s, c.person_acted),
         "new user text sooner after the conversation's previous answer ended than a person "
         "can read and type (the typing window), with no sign the person acted: the agent "
         "wrote it (a re-ask after a malformed answer, an automatic follow-up)"),
    Rule("other_conversation_while_open", "side",
         lambda f, c: c.turn_open and _other_conversation(f, c)
         and (not f.offers_tools or f.model != c.turn_model),
         "sent while a turn is open on another conversation, without tools or to another "
         "model (title / summary / memory calls)"),
    Rule("structured_without_tools", "side",
         lambda f, c: f.structured and not f.offers_tools and f.ends == "user_text",
         "asks for JSON (schema) output and offers no tools: a title or summary call"),
    Rule("tool_client_without_tools", "side",
         lambda f, c: c.turn_offers_tools and not f.offers_tools
         and c.client is not None and c.client == c.turn_client and _other_conversation(f, c),
         "an agent that offers tools on its turns sends a request without tools on another "
         "conversation"),
    Rule("new_input", "human", lambda f, c: True,
         "anything else: new input from the person"),
)


def classify(f: Features, ctx: Context, rules: tuple[Rule, ...] = RULES) -> tuple[str, str]:
    """(kind, rule name) of the first rule that applies; tool-output continuations name
    the wire-level reason too (``tool_output:responses:function_call_output``)."""
    for rule in rules:
        if rule.applies(f, ctx):
            name = f"{rule.name}:{f.ends_how}" if rule.name == "tool_output" else rule.name
            return rule.kind, name
    return "human", "new_input"


# ---------------------------------------------------------------------------- features


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part) for part in content)
    if isinstance(content, dict):
        for key in ("text", "content"):
            if key in content:
                return _text(content[key])
    return ""


def _key(*parts: str) -> str | None:
    if not any(parts):
        return None
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()


def _dicts(items: Any) -> list[dict[str, Any]]:
    """The objects of a list field; any other shape (a number, a string, null) reads as
    empty: classification runs before the upstream sees the body, so it must take anything."""
    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def _chat(body: dict[str, Any]) -> tuple[Ends, str, str | None]:
    messages = _dicts(body.get("messages"))
    system = [_text(m.get("content")) for m in messages if m.get("role") in _SYSTEM_ROLES]
    first_user = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    rest = [m for m in messages if m.get("role") not in _SYSTEM_ROLES]
    key = _key(system[0] if system else "", first_user)
    if not rest:
        return "empty", "chat:no_messages", key
    last = rest[-1]
    role = last.get("role")
    if role in ("tool", "function"):
        return "tool_output", f"chat:{role}_message", key
    if role == "assistant":
        return "assistant", "chat:assistant_last", key
    return "user_text", "chat:user_message", key


def _messages(body: dict[str, Any]) -> tuple[Ends, str, str | None]:
    messages = _dicts(body.get("messages"))
    first_user = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    key = _key(_text(body.get("system")), first_user)
    # Claude Code appends mid-conversation "system" messages after the user's.
    rest = [m for m in messages if m.get("role") != "system"]
    if not rest:
        return "empty", "messages:no_messages", key
    last = rest[-1]
    if last.get("role") == "assistant":
        return "assistant", "messages:assistant_last", key
    content = last.get("content")
    if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_result", "mcp_tool_result")
            for b in content):
        # Tool results, possibly with reminders the client added as text: a continuation.
        return "tool_output", "messages:tool_result", key
    return "user_text", "messages:user_message", key


def _responses(body: dict[str, Any]) -> tuple[Ends, str, str | None]:
    items = body.get("input")
    listed: list[Any] = [] if items is None else [items] if isinstance(items, str) else (
        items if isinstance(items, list) else [])
    previous = body.get("previous_response_id")

    def role(i: Any) -> str | None:
        if isinstance(i, str):
            return "user"
        if not isinstance(i, dict):
            return None
        if i.get("type") in (None, "message"):
            return str(i.get("role") or "user")
        return None

    system = _text(body.get("instructions")) + "".join(
        _text(i.get("content")) for i in listed if role(i) in _SYSTEM_ROLES)
    users = [i for i in listed if role(i) == "user"]
    first_user = (users[0] if isinstance(users[0], str) else _text(users[0].get("content"))
                  ) if users else ""
    key = _key(system, first_user) if previous is None else None
    rest = [i for i in listed if role(i) not in _SYSTEM_ROLES]
    if not rest:
        return "empty", "responses:no_input", key
    last = rest[-1]
    type_ = last.get("type") if isinstance(last, dict) else None
    if type_ in _TOOL_RESULT_ITEMS:
        how = "previous_response_tool_output" if previous and all(
            isinstance(i, dict) and i.get("type") in _TOOL_RESULT_ITEMS for i in rest) else type_
        return "tool_output", f"responses:{how}", key
    r = role(last)
    if r == "user":
        return "user_text", "responses:user_message", key
    return "assistant", f"responses:{type_ or r}_last", key


def _completions(body: dict[str, Any]) -> tuple[Ends, str, str | None]:
    return "user_text", "completions:prompt", None


_READERS = {"chat": _chat, "messages": _messages, "responses": _responses,
            "completions": _completions}


def _structured(protocol: str, body: dict[str, Any]) -> bool:
    if protocol == "chat":
        spec = body.get("response_format")
    elif protocol == "responses":
        text = body.get("text")
        spec = text.get("format") if isinstance(text, dict) else None
    elif protocol == "messages":
        config = body.get("output_config")
        spec = config.get("format") if isinstance(config, dict) else body.get("output_format")
    else:
        return False
    return isinstance(spec, dict) and spec.get("type") in ("json_schema", "json_object")


def features(protocol: str, body: dict[str, Any], secret: bytes | None = None) -> Features:
    """What the rules read of a request body of ``protocol`` (chat, completions,
    responses, messages); tolerant of any shape (a bad field reads as absent). With
    ``secret`` (the study's: :func:`flowtrial.study.keys.conversation_secret`) the
    conversation key is keyed (HMAC), so no one without it can test a guessed prompt."""
    ends, how, key = _READERS.get(protocol, _completions)(body)
    if key is not None and secret:
        key = hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16]
    model = body.get("model")
    max_tokens = next((v for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                       if isinstance(v := body.get(k), int) and not isinstance(v, bool)), None)
    previous = body.get("previous_response_id")
    return Features(
        protocol=protocol, ends=ends, ends_how=how,
        offers_tools=bool(body.get("tools")) and isinstance(body.get("tools"), list),
        model=model if isinstance(model, str) else None, conversation_key=key,
        max_tokens=max_tokens, structured=_structured(protocol, body),
        previous_response_id=previous if isinstance(previous, str) else None,
    )
