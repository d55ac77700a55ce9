"""Classifying a model request: ``human`` / ``continuation`` / ``side`` / ``retry``.

Pure functions, no I/O: :func:`features` reads what the rules need from a request body
(what it ends with, whether it offers tools, its conversation) through the protocol
module's view of the request, :func:`classify` runs the
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
from typing import Any

from ..proxy.protocols import RequestInfo, read_view
from ..proxy.protocols.view import Ends
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
    "features_of",
]



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


def features(protocol: str, body: dict[str, Any], secret: bytes | None = None) -> Features:
    """What the rules read of a request body of ``protocol``: its protocol module's view
    (:class:`~flowtrial.instrumentation.proxy.protocols.RequestInfo`), so a new protocol is
    classified without a change here; tolerant of any shape (a bad field reads as absent).
    With ``secret`` (the study's: :func:`flowtrial.study.keys.conversation_secret`) the
    conversation key is keyed (HMAC), so no one without it can test a guessed prompt."""
    return features_of(protocol, read_view(protocol, body), secret)


def features_of(protocol: str, view: RequestInfo, secret: bytes | None = None) -> Features:
    """The rules' features of a request already read into its view."""
    key = view.conversation_key
    if key is not None and secret:
        key = hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16]
    return Features(
        protocol=protocol, ends=view.ends, ends_how=view.ends_how,
        offers_tools=view.offers_tools, model=view.model,
        conversation_key=key, max_tokens=view.max_tokens,
        structured=view.structured, previous_response_id=view.previous_response_id,
    )
