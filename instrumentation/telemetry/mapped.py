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

from dataclasses import dataclass, field
from typing import Any, Literal

from .otlp import OtelRecord

__all__ = ["CONTENT_KEYS", "Link", "MappedEvent", "custom_event", "number", "scrub"]

#: How the event finds its cycle: ``request`` = the cycle it timed (by start, model, ids);
#: ``before`` = the latest cycle answered before it (the answer that proposed the tool);
#: ``after`` = the first cycle requested after it (the request the prompt started).
Link = Literal["request", "before", "after", "none"]

#: Attributes holding what the person or the model wrote: kept only with capture.content
#: = "full" (prompt text, tool arguments and output, responses, system prompts).
CONTENT_KEYS = frozenset({
    "prompt", "response", "response_text", "output", "arguments", "function_args",
    "tool_parameters", "tool_input", "system_prompt", "error", "error.message",
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
    "user.email", "tool",
})


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


def scrub(attributes: dict[str, Any], full: bool) -> dict[str, Any]:
    """The attributes worth keeping: content only with ``full``."""
    if full:
        return dict(attributes)
    return {k: v for k, v in attributes.items() if k not in CONTENT_KEYS}


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
