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

from ..proxy.protocols import RequestInfo, read_view
from .harmless import pick_harmless

__all__ = ["ToolCall", "ToolPlanner"]

_PROTOCOLS = ("chat", "responses", "messages", "gemini")
_MAX_CHAINS = 10_000


@dataclass(frozen=True)
class ToolCall:
    """One tool call to answer with."""

    name: str
    arguments: str  # JSON text
    call_id: str
    step: int  # 1-based step of the turn


class ToolPlanner:
    """Decides, per request, whether to answer with a tool call (and which)."""

    def __init__(self, steps: int, seed: int = 0) -> None:
        if steps < 0:
            raise ValueError(f"tool_steps must be >= 0, got {steps}")
        self.steps = steps
        self.seed = seed
        self._chains: dict[str, int] = {}  # Responses id -> tool steps of its turn so far

    def plan(self, protocol: str, body: dict[str, Any],
             view: RequestInfo | None = None) -> ToolCall | None:
        """The tool call to answer ``body`` with, or None for the text answer. ``view``: the
        request as its protocol module reads it (tools offered, tool calls since the person's
        last message), read here when not given."""
        if self.steps == 0 or protocol not in _PROTOCOLS:
            return None
        if view is None:
            view = read_view(protocol, body)
        done = view.tool_calls_since_person
        previous = view.previous_response_id
        if protocol == "responses" and not view.has_person and previous is not None:
            done += self._chains.get(previous, 0)
        if done >= self.steps:
            return None
        picked = pick_harmless(list(view.tools))
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
