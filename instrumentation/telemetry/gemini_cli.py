"""Gemini CLI telemetry (``telemetry.enabled``, ``otlpEndpoint``, ``otlpProtocol = "http"``)
→ flowtrial events.

Log events carry ``event.name`` = ``gemini_cli.<event>`` (``packages/core/src/telemetry/
types.ts``): ``user_prompt`` {prompt_length, prompt_id, prompt (with logPrompts)};
``api_response`` {model, duration_ms, input_token_count, output_token_count, status_code,
prompt_id}; ``tool_call`` {function_name, duration_ms, success, decision: accept | reject |
modify | auto_accept, prompt_id, tool_type}. A ``tool_call`` is both a decision (when it has
one) and the tool's run time.
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

AGENT = "gemini_cli"
_PREFIX = AGENT + "."
#: decision → (flowtrial kind, decided by). ``auto_accept`` is an "always allow" answered
#: earlier (or a policy): no one was asked this time.
DECISIONS = {
    "accept": ("accept", "person"),
    "auto_accept": ("accept", "config"),
    "reject": ("reject", "person"),
    "modify": ("partial_accept", "person"),
}


def map_record(rec: OtelRecord, full: bool) -> list[MappedEvent] | None:
    """The events for one Gemini CLI record; None if it is not Gemini CLI's."""
    name = agent_log_name(rec, _PREFIX)
    if name is None:
        return None
    a = rec.attributes
    p: dict[str, Any] = {"agent": AGENT, "otel": rec.name}
    for key in ("session.id", "prompt_id"):
        if a.get(key):
            p[key.replace(".", "_")] = a[key]
    if name == "user_prompt":
        return prompt_event(rec, p, full)
    if name == "api_response":
        p |= {"model": a.get("model"), "duration_ms": number(a.get("duration_ms")),
              "input_tokens": number(a.get("input_token_count")),
              "output_tokens": number(a.get("output_token_count")),
              "status": number(a.get("status_code"))}
        return request_event(rec, p, a.get("model"))
    if name == "tool_call":
        tool = {"tool": a.get("function_name"), "tool_type": a.get("tool_type"),
                "success": bool(a.get("success"))}
        out = [tool_event(rec, p | tool)]
        decision = a.get("decision")
        if decision:
            kind, by = DECISIONS.get(str(decision), ("reject", "person"))
            dp = p | tool | {"decision": decision, "source": "gemini_cli",
                             "decided_by": by}
            if kind == "partial_accept":
                dp["modified"] = True
            # The decision came before the tool ran: at the call's start when known.
            start = number(a.get("start_time"))
            ts = round(start * 1e6) if start else rec.time_ns
            out.insert(0, MappedEvent(kind, ts, dp, link="before",
                                      digest=rec.digest + ":decision"))
        return out
    return None
