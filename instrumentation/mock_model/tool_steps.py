"""Tool steps: the simulated model drives an agent through a multi-step turn.

With ``tool_steps = N`` (``[upstream] tool_steps`` in a study, ``--tool-steps`` on
``flowtrial mock-model``) a request that offers tools is answered with a call to a *harmless*
offered tool for the first N steps of the person's turn, then with the usual text answer.
Harmless means read-only, chosen from the offered schemas by :mod:`.harmless`: list a
directory, print the working directory, run ``pwd`` through a shell tool (Codex's
``exec_command``, Claude Code's ``Bash``, opencode's ``bash`` …), read or search; an agent
offering none of these gets text at once. The step is read from the request (tool
calls since the person's last message), so the same request gets the same answer; the
Responses chain (``previous_response_id`` with only tool outputs) is followed in memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .harmless import pick_harmless

__all__ = ["ToolCall", "ToolPlanner"]

_CALL_TYPES = ("function_call", "custom_tool_call", "local_shell_call")
_MAX_CHAINS = 10_000


@dataclass(frozen=True)
class ToolCall:
    """One tool call to answer with."""

    name: str
    arguments: str  # JSON text
    call_id: str
    step: int  # 1-based step of the turn


def _tools(protocol: str, body: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, JSON schema of the arguments) of each function tool offered."""
    out = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        spec: Any = None
        if protocol == "chat":
            spec = tool.get("function") if tool.get("type") == "function" else None
            schema = spec.get("parameters") if isinstance(spec, dict) else None
        elif protocol == "responses":
            spec = tool if tool.get("type") == "function" else None
            schema = tool.get("parameters")
        elif protocol == "messages":
            spec = tool if "input_schema" in tool else None
            schema = tool.get("input_schema")
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            description = spec.get("description")
            out.append((spec["name"], description if isinstance(description, str) else "",
                        schema if isinstance(schema, dict) else {}))
    return out


def _calls_since_person(protocol: str, body: dict[str, Any]) -> tuple[int, bool]:
    """Tool calls the model made since the person's last message, and whether the input
    holds such a message at all."""
    if protocol == "chat":
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        return sum(1 for m in messages[last + 1:] if m.get("role") == "assistant"
                   and m.get("tool_calls")), last >= 0
    if protocol == "messages":
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]

        def person(m: dict[str, Any]) -> bool:
            content = m.get("content")
            return m.get("role") == "user" and not (isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content))

        last = max((i for i, m in enumerate(messages) if person(m)), default=-1)
        return sum(1 for m in messages[last + 1:] if m.get("role") == "assistant"
                   and isinstance(m.get("content"), list) and any(
                       isinstance(b, dict) and b.get("type") == "tool_use"
                       for b in m["content"])), last >= 0
    items = body.get("input")
    listed = [items] if isinstance(items, str) else items if isinstance(items, list) else []

    def user(i: Any) -> bool:
        return isinstance(i, str) or (isinstance(i, dict) and i.get("type") in (None, "message")
                                      and i.get("role", "user") == "user")

    last = max((k for k, i in enumerate(listed) if user(i)), default=-1)
    return sum(1 for i in listed[last + 1:] if isinstance(i, dict)
               and i.get("type") in _CALL_TYPES), last >= 0


class ToolPlanner:
    """Decides, per request, whether to answer with a tool call (and which)."""

    def __init__(self, steps: int, seed: int = 0) -> None:
        if steps < 0:
            raise ValueError(f"tool_steps must be >= 0, got {steps}")
        self.steps = steps
        self.seed = seed
        self._chains: dict[str, int] = {}  # Responses id -> tool steps of its turn so far

    def plan(self, protocol: str, body: dict[str, Any]) -> ToolCall | None:
        """The tool call to answer ``body`` with, or None for the text answer."""
        if self.steps == 0 or protocol not in ("chat", "responses", "messages"):
            return None
        done, has_person = _calls_since_person(protocol, body)
        previous = body.get("previous_response_id")
        if protocol == "responses" and not has_person and isinstance(previous, str):
            done += self._chains.get(previous, 0)
        if done >= self.steps:
            return None
        picked = pick_harmless(_tools(protocol, body))
        if picked is None:
            return None
        name, args = picked
        digest = hashlib.blake2b(
            f"{self.seed}/{done}/{json.dumps(body, sort_keys=True, default=str)}".encode(),
            digest_size=12).hexdigest()
        return ToolCall(name, json.dumps(args), "call_" + digest, done + 1)

    def answered(self, response_id: str, call: ToolCall | None) -> None:
        """Remember how far a Responses turn got (for chains by previous_response_id)."""
        if len(self._chains) >= _MAX_CHAINS:
            self._chains.pop(next(iter(self._chains)))
        self._chains[response_id] = call.step if call is not None else 0
