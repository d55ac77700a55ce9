"""Tool steps: the simulated model drives an agent through a multi-step turn.

With ``tool_steps = N`` (``[upstream] tool_steps`` in a study, ``--tool-steps`` on
``flowtrial mock-model``) a request that offers tools is answered with a call to a *harmless*
offered tool for the first N steps of the person's turn, then with the usual text answer.
Harmless means: list a directory (``LS``, ``list_dir``, ``Glob`` …) or, failing that, run
``pwd`` through the shell tool (Codex's ``exec_command``, Claude Code's ``Bash``, ``shell``
…). An agent offering neither gets text at once. The step is read from the request (tool
calls since the person's last message), so the same request gets the same answer; the
Responses chain (``previous_response_id`` with only tool outputs) is followed in memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..proxy.protocols import RequestInfo, read_view

__all__ = ["ToolCall", "ToolPlanner"]

#: Listing tools first (nothing runs), then shells with `pwd`; names compared lower-cased.
_LISTERS = ("ls", "list_dir", "list_directory", "glob", "find_files")
_SHELLS = ("exec_command", "shell", "bash", "run_shell_command", "shell_command",
           "local_shell", "run_terminal_cmd", "execute_command")
_COMMAND_KEYS = ("cmd", "command")
_PATH_KEYS = ("path", "dir_path", "directory", "target_directory", "absolute_path")
_PATTERN_KEYS = ("pattern", "glob")
_PROTOCOLS = ("chat", "responses", "messages", "gemini")
_MAX_CHAINS = 10_000


@dataclass(frozen=True)
class ToolCall:
    """One tool call to answer with."""

    name: str
    arguments: str  # JSON text
    call_id: str
    step: int  # 1-based step of the turn


def _arguments(kind: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """Arguments for a lister or shell tool that fit its schema (None if they cannot)."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    args: dict[str, Any] = {}
    if kind == "shell":
        key = next((k for k in _COMMAND_KEYS if k in props), None)
        if key is None:
            return None
        is_list = (props[key] or {}).get("type") == "array"
        args[key] = ["pwd"] if is_list else "pwd"
    else:
        for key in props:
            if key in _PATH_KEYS:
                args[key] = "."
            elif key in _PATTERN_KEYS:
                args[key] = "*"
    for key in required:
        if key in args:
            continue
        spec = props.get(key) or {}
        if key == "description" or spec.get("type") == "string":
            args[key] = "List the working directory" if key == "description" else "."
        else:
            return None  # a required argument we cannot fill harmlessly
    return args


def _pick(view: RequestInfo) -> tuple[str, dict[str, Any]] | None:
    for kinds, names in (("lister", _LISTERS), ("shell", _SHELLS)):
        for wanted in names:
            for name, _, schema in view.tools:
                if name.lower() == wanted:
                    args = _arguments(kinds, schema if isinstance(schema, dict) else {})
                    if args is not None:
                        return name, args
    return None


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
        picked = _pick(view)
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
