"""What an agent's telemetry record becomes: a flowtrial event before it is linked to a cycle.

Kinds written (``events.kind``, ``source = "otel"``):

==================  ============================================================================
``turn_start``      the person sent a prompt (turn-start evidence); ``payload.prompt`` only when
                    the study captures content in full
``accept``          a tool call went ahead; ``payload.decided_by`` = ``person`` or ``config``
``reject``          a tool call was refused or aborted (``payload.source`` keeps the agent's word)
``partial_accept``  the person changed the proposed call before it ran (Gemini ``modify``)
``api_request``     one model request as the agent timed it (``duration_s``, ``payload.model``)
``tool_result``     a tool ran for ``duration_s`` (the turn's tool time)
``agent_wait``      the agent waited ``duration_s`` for the person (a permission prompt)
``turn_end``        the agent finished the turn (``duration_s`` = the whole turn)
``custom``          anything else, ``payload.name`` = the record's name; nothing is dropped
==================  ============================================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from .otlp import OtelRecord

__all__ = [
    "AGENT_CONTENT_KEYS",
    "CONTENT_KEYS",
    "SAFE_STRING_CHARS",
    "Link",
    "MappedEvent",
    "agent_log_name",
    "custom_event",
    "number",
    "prompt_event",
    "request_event",
    "scrub",
    "seconds_from_ms",
    "tool_event",
]

#: How the event finds its cycle: ``request`` = the cycle it timed (by start, model, ids);
#: ``before`` = the latest cycle requested before it (the answer that proposed the tool, which
#: may still be streaming its final events when the agent decides);
#: ``after`` = the first cycle requested after it (the request the prompt started).
Link = Literal["request", "before", "after", "none"]

#: Attributes holding what the person or the model wrote: kept only with capture.content
#: = "full" (prompt text, tool arguments and output, responses, system prompts), per agent
#: as their telemetry documents them, plus the OpenTelemetry GenAI conventions' names.
AGENT_CONTENT_KEYS: dict[str, frozenset[str]] = {
    "claude_code": frozenset({"prompt", "tool_parameters", "tool_input", "error",
                              "user.email", "tool", "body", "content"}),
    "codex": frozenset({"prompt", "arguments", "output", "response", "function_args",
                        "tool_result", "result", "command", "error.message"}),
    "gemini_cli": frozenset({"prompt", "function_args", "response_text", "output",
                             "error", "error.message", "content", "system_prompt"}),
    "gen_ai": frozenset({"gen_ai.input.messages", "gen_ai.output.messages",
                         "gen_ai.system_instructions", "gen_ai.prompt", "gen_ai.completion",
                         "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}),
}
CONTENT_KEYS = frozenset().union(*AGENT_CONTENT_KEYS.values())
#: With content = "none", any other string attribute longer than this is stored as its
#: fingerprint (``{"sha256": first 16 hex digits, "chars": length}``), never whole: an agent
#: may put code or command output under a name no list knows.
SAFE_STRING_CHARS = 256


@dataclass
class MappedEvent:
    kind: str
    ts_ns: int  # UTC epoch ns
    payload: dict[str, Any]
    duration_s: float | None = None
    link: Link = "none"
    model: str | None = None
    start_ns: int | None = None  # a request's start (link="request")
    ids: tuple[str, ...] = ()  # request ids the agent saw (exact cycle link if one is a cycle)
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def number(value: Any) -> float | None:
    """A numeric attribute (agents send numbers as strings too), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out and abs(out) != float("inf") else None


def seconds_from_ms(value: Any) -> float | None:
    """A ``duration_ms`` attribute in seconds (None if absent, not a number or negative)."""
    ms = number(value)
    return ms / 1000.0 if ms is not None and ms >= 0 else None


def agent_log_name(rec: OtelRecord, prefix: str) -> str | None:
    """The event name without ``prefix`` for a log record of that agent, else None."""
    if rec.signal != "logs" or not rec.name.startswith(prefix):
        return None
    return rec.name[len(prefix):]


def prompt_event(rec: OtelRecord, payload: dict[str, Any], full: bool,
                 redacted: str | None = None) -> list[MappedEvent]:
    """A ``user_prompt``: turn-start evidence; its text only with ``full`` (and not the
    agent's redaction placeholder)."""
    a = rec.attributes
    payload["prompt_length"] = number(a.get("prompt_length"))
    if full and a.get("prompt") and a.get("prompt") != redacted:
        payload["prompt"] = a["prompt"]
    return [MappedEvent("turn_start", rec.time_ns, payload, link="after", digest=rec.digest)]


def request_event(rec: OtelRecord, payload: dict[str, Any], model: Any,
                  ids: tuple[str, ...] = ()) -> list[MappedEvent]:
    """A model request the agent timed (``duration_ms``, ending at the record's time)."""
    duration = seconds_from_ms(rec.attributes.get("duration_ms"))
    start = rec.time_ns - round(duration * 1e9) if duration is not None else None
    return [MappedEvent("api_request", rec.time_ns, payload, duration, "request",
                        str(model) if model else None, start, ids, rec.digest)]


def tool_event(rec: OtelRecord, payload: dict[str, Any], digest: str | None = None
               ) -> MappedEvent:
    """A tool's run (``duration_ms`` of it, ending at the record's time): the turn's tool
    time, on the cycle whose answer asked for the tool."""
    return MappedEvent("tool_result", rec.time_ns, payload,
                       seconds_from_ms(rec.attributes.get("duration_ms")), "before",
                       digest=digest or rec.digest)


def _fingerprint(text: str) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16],
            "chars": len(text)}


def _safe(value: Any) -> Any:
    """``value`` with every string longer than :data:`SAFE_STRING_CHARS` fingerprinted."""
    if isinstance(value, str):
        return _fingerprint(value) if len(value) > SAFE_STRING_CHARS else value
    if isinstance(value, dict):
        return {k: _safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe(v) for v in value]
    return value


def scrub(attributes: dict[str, Any], full: bool) -> dict[str, Any]:
    """The attributes worth keeping: content only with ``full``. Otherwise the content keys
    (:data:`AGENT_CONTENT_KEYS`, and names ending in one of them) are dropped and long strings
    fingerprinted (:data:`SAFE_STRING_CHARS`)."""
    if full:
        return dict(attributes)
    return {k: _safe(v) for k, v in attributes.items()
            if k not in CONTENT_KEYS and k.rsplit(".", 1)[-1] not in CONTENT_KEYS}


def custom_event(rec: OtelRecord, full: bool, agent: str | None = None) -> MappedEvent:
    """A record no mapping knows: kept whole (minus content) as a ``custom`` event."""
    payload: dict[str, Any] = {"name": rec.name or "(unnamed)", "signal": rec.signal,
                               "attributes": scrub(rec.attributes, full)}
    if agent:
        payload["agent"] = agent
    if rec.scope:
        payload["scope"] = rec.scope
    duration = None
    if rec.end_ns and rec.end_ns >= rec.time_ns:
        duration = (rec.end_ns - rec.time_ns) / 1e9
    return MappedEvent("custom", rec.time_ns, payload, duration, digest=rec.digest)
