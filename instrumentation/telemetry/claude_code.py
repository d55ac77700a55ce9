"""Claude Code telemetry (``CLAUDE_CODE_ENABLE_TELEMETRY=1``) → flowtrial events.

Log events carry ``event.name`` without the prefix (``tool_decision``) and the body
``claude_code.tool_decision``; spans (``CLAUDE_CODE_ENHANCED_TELEMETRY_BETA=1`` with
``OTEL_TRACES_EXPORTER=otlp``) are named ``claude_code.interaction``, ``…llm_request``,
``…tool.blocked_on_user``. Attribute names as in the shipped 2.1 build: ``tool_decision``
{decision: accept|reject, source: config | user_permanent | user_temporary | user_abort |
user_reject | hook:… | rule:… | mode:… | classifier…, tool_name, tool_use_id};
``api_request`` {model, duration_ms, input_tokens, output_tokens, request_id, …};
``tool_result`` {tool_name, tool_use_id, success, duration_ms}; ``user_prompt``
{prompt_length, prompt, prompt.id}.
"""

from __future__ import annotations

from typing import Any

from .mapped import (
    MappedEvent,
    number,
    prompt_event,
    request_event,
    scrub,
    seconds_from_ms,
    tool_event,
)
from .otlp import OtelRecord

__all__ = ["AGENT", "map_record"]

AGENT = "claude_code"
_PREFIX = AGENT + "."


def _short(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def decided_by(source: str) -> str:
    """``person`` for the user_* sources (they answered a prompt), else ``config`` (a rule,
    mode, hook or classifier decided without asking)."""
    return "person" if source.startswith("user") else "config"


def _base(rec: OtelRecord, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"agent": AGENT, "otel": _PREFIX + name}
    for key in ("session.id", "prompt.id"):
        if rec.attributes.get(key):
            out[key.replace(".", "_")] = rec.attributes[key]
    return out


def map_record(rec: OtelRecord, full: bool) -> list[MappedEvent] | None:
    """The events for one Claude Code record; None if it is not Claude Code's."""
    name = _short(rec.name)
    if not rec.name.startswith(_PREFIX):
        return None
    a = rec.attributes
    p = _base(rec, name)
    if rec.signal == "logs":
        if name == "user_prompt":
            return prompt_event(rec, p, full, redacted="<REDACTED>")
        if name == "tool_decision":
            source = str(a.get("source") or "unknown")
            kind = "accept" if a.get("decision") == "accept" else "reject"
            p |= {"decision": a.get("decision"), "source": source,
                  "decided_by": decided_by(source), "tool": a.get("tool_name"),
                  "call_id": a.get("tool_use_id")}
            return [MappedEvent(kind, rec.time_ns, p, link="before", digest=rec.digest)]
        if name == "api_request":
            p |= {"model": a.get("model"), "duration_ms": number(a.get("duration_ms")),
                  "input_tokens": number(a.get("input_tokens")),
                  "output_tokens": number(a.get("output_tokens")),
                  "request_id": a.get("request_id")}
            ids = tuple(str(a[k]) for k in ("request_id",) if a.get(k))
            return request_event(rec, p, a.get("model"), ids)
        if name == "tool_result":
            p |= {"tool": a.get("tool_name"), "call_id": a.get("tool_use_id"),
                  "success": str(a.get("success")).lower() == "true"}
            return [tool_event(rec, p)]
        return None
    if rec.signal != "traces" or not rec.end_ns:
        return None
    span_s = max(0, rec.end_ns - rec.time_ns) / 1e9
    if name == "tool.blocked_on_user" and decided_by(str(a.get("source") or "")) == "person":
        # The span also wraps permission checks no one was asked about (a rule allowed
        # the tool: source "unknown" or config); only the person's answer is a wait for them.
        p |= {"decision": a.get("decision"), "source": a.get("source")}
        waited = seconds_from_ms(a.get("duration_ms")) or span_s
        return [MappedEvent("agent_wait", rec.time_ns, p, waited, "before", digest=rec.digest)]
    if name == "llm_request":
        p |= {"model": a.get("model") or a.get("gen_ai.request.model"),
              "ttft_ms": number(a.get("ttft_ms")), "duration_ms": span_s * 1000,
              "context": a.get("llm_request.context"), "span": True}
        return [MappedEvent("api_request", rec.end_ns, p, span_s, "request", p["model"],
                            rec.time_ns, digest=rec.digest)]
    if name == "interaction":
        p["attributes"] = scrub(a, full)
        return [MappedEvent("turn_end", rec.end_ns, p, span_s, "before", digest=rec.digest)]
    return None
