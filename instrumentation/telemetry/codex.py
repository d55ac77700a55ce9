"""Codex CLI telemetry (``[otel]`` in ``config.toml``) → flowtrial events.

Every log event carries ``event.name`` = ``codex.<event>`` and the session's ``model``,
``slug`` and ``conversation.id`` (``codex-rs/otel/src/events``). ``codex.tool_decision``
{tool_name, call_id, decision: approved | approved_for_session | denied | abort | …,
source: Config | User | AutomatedReviewer (0.169 writes the enum names; the docs say config |
user)}; ``codex.api_request`` {duration_ms, http.response.status_code, attempt, endpoint,
auth.request_id}; ``codex.tool_result`` {tool_name, call_id,
duration_ms, success}; ``codex.user_prompt`` {prompt_length, prompt (``[REDACTED]`` unless
``log_user_prompt``)}; ``codex.agent_turn_complete`` {turn.id, client, input_messages,
input_length}: not Codex's own, but its ``notify`` hook's turn end sent by
``flowtrial codex-notify`` (:mod:`.notify`), a ``turn_end``. Codex emits some events as
spans too (``trace`` side of ``log_and_trace_event!``): only the logs are mapped, spans of
those names are kept as ``custom``.
"""

from __future__ import annotations

from typing import Any

from .mapped import (
    MappedEvent,
    agent_log_name,
    number,
    prompt_event,
    request_event,
    tool_event,
)
from .otlp import OtelRecord

__all__ = ["AGENT", "map_record"]

AGENT = "codex"
_PREFIX = AGENT + "."


def decision_kind(decision: str) -> str:
    """``accept`` for every approval (once, for the session, with a policy amendment …),
    ``reject`` for denied, abort, timed out."""
    return "accept" if decision.startswith("approved") else "reject"


def decided_by(source: str) -> str:
    """``person`` when the user answered (Codex 0.169 writes the enum's name, ``User``;
    its docs say ``user``), else ``config`` (policy, hook or automated reviewer)."""
    return "person" if source.lower() == "user" else "config"


def map_record(rec: OtelRecord, full: bool) -> list[MappedEvent] | None:
    """The events for one Codex record; None if it is not Codex's (or not a mapped log)."""
    name = agent_log_name(rec, _PREFIX)
    if name is None:
        return None
    a = rec.attributes
    p: dict[str, Any] = {"agent": AGENT, "otel": rec.name}
    if a.get("conversation.id"):
        p["session_id"] = a["conversation.id"]
    if name == "user_prompt":
        return prompt_event(rec, p, full, redacted="[REDACTED]")
    if name == "tool_decision":
        decision = str(a.get("decision") or "unknown").lower()
        source = str(a.get("source") or "unknown")
        p |= {"decision": decision, "source": source, "decided_by": decided_by(source),
              "tool": a.get("tool_name"), "call_id": a.get("call_id")}
        return [MappedEvent(decision_kind(decision), rec.time_ns, p, link="before",
                            digest=rec.digest)]
    if name == "api_request":
        p |= {"model": a.get("model"), "duration_ms": number(a.get("duration_ms")),
              "status": number(a.get("http.response.status_code")),
              "attempt": number(a.get("attempt")), "endpoint": a.get("endpoint")}
        ids = tuple(str(a[k]) for k in ("auth.request_id",) if a.get(k))
        return request_event(rec, p, a.get("model"), ids)
    if name == "tool_result":
        p |= {"tool": a.get("tool_name"), "call_id": a.get("call_id"),
              "success": str(a.get("success")).lower() == "true"}
        return [tool_event(rec, p)]
    if name == "sse_event" and a.get("event.kind") == "response.completed":
        # Codex's api_request ends at the response headers; the stream's end is this event.
        return [MappedEvent("answer_end", rec.time_ns, p, link="before", digest=rec.digest)]
    if name == "agent_turn_complete":  # its notify hook, through `flowtrial codex-notify`
        p |= {"turn_id": a.get("turn.id"), "client": a.get("client"),
              "input_messages": number(a.get("input_messages")),
              "input_length": number(a.get("input_length"))}
        return [MappedEvent("turn_end", rec.time_ns, p, link="before", digest=rec.digest)]
    return None
