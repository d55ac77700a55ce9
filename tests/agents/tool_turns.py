"""A model turn that calls a tool: the built-in simulated model never does (on purpose), but an
agent only decides about tools when the model asks for one. This upstream is the simulated
model, except that a request offering a shell tool and carrying no tool result yet is
answered with a call to that tool (run `echo flowtrial`); the follow-up request, carrying the
tool's output, gets the simulated model's usual answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flowtrial.instrumentation.proxy.upstream import MockUpstream, UpstreamReply

__all__ = ["COMMAND", "ToolTurnUpstream", "serve_tool_proxy"]

COMMAND = "echo flowtrial"
_SSE = "text/event-stream; charset=utf-8"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _anthropic_tool_call(model: str, command: str) -> list[bytes]:
    usage = {"input_tokens": 50, "output_tokens": 1}
    args = json.dumps({"command": command, "description": "Run a command"})
    return [
        _sse("message_start", {"type": "message_start", "message": {
            "id": "msg_tool_turn", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "tool_use", "id": "toolu_ft1",
                                                       "name": "Bash", "input": {}}}),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": args}}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 20}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def _responses_tool_call(model: str, tool: str) -> list[bytes]:
    args = {"exec_command": {"cmd": COMMAND}, "shell_command": {"command": COMMAND},
            "shell": {"command": ["echo", "flowtrial"]}}[tool]
    item = {"type": "function_call", "id": "fc_ft1", "call_id": "call_ft1", "name": tool,
            "arguments": json.dumps(args), "status": "completed"}
    resp = {"id": "resp_tool_turn", "object": "response", "created_at": 1, "model": model,
            "status": "in_progress", "output": []}
    done = resp | {"status": "completed", "output": [item], "usage": {
        "input_tokens": 50, "output_tokens": 20, "total_tokens": 70,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0}}}
    return [
        _sse("response.created", {"type": "response.created", "response": resp}),
        _sse("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0,
                                            "item": item | {"arguments": "",
                                                            "status": "in_progress"}}),
        _sse("response.function_call_arguments.delta", {
            "type": "response.function_call_arguments.delta", "item_id": "fc_ft1",
            "output_index": 0, "delta": item["arguments"]}),
        _sse("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
        _sse("response.completed", {"type": "response.completed", "response": done}),
    ]


def _tool_names(obj: dict[str, Any]) -> set[str]:
    return {str(t.get("name")) for t in obj.get("tools") or [] if isinstance(t, dict)}


def _has_tool_result(obj: dict[str, Any]) -> bool:
    text = json.dumps(obj.get("messages") or obj.get("input") or [])
    return '"tool_result"' in text or '"function_call_output"' in text


class ToolTurnUpstream(MockUpstream):
    """The simulated model, with a shell tool call as the first answer of a turn."""

    name = "mock"

    def __init__(self, command: str = COMMAND) -> None:
        super().__init__(tokens_per_second=5000, ttft_ms=5)
        self.command = command  # Claude Code's Bash call (Codex always gets COMMAND)
        self.tool_calls = 0

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> UpstreamReply:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj.get("stream") and not _has_tool_result(obj):
            names, model = _tool_names(obj), str(obj.get("model") or "flowtrial-sim-1")
            chunks, route = None, path.split("?", 1)[0]
            if route.endswith("/messages") and "Bash" in names:
                chunks = _anthropic_tool_call(model, self.command)
            elif route.endswith("/responses"):
                tool = next((t for t in ("exec_command", "shell_command", "shell")
                             if t in names), None)
                chunks = _responses_tool_call(model, tool) if tool else None
            if chunks is not None:
                self.tool_calls += 1

                async def gen() -> AsyncIterator[bytes]:
                    for c in chunks:
                        yield c

                return UpstreamReply(200, [("content-type", _SSE)], gen())
        return await super().request(method, path, headers, body)


@contextmanager
def serve_tool_proxy(folder: Path, command: str = COMMAND
                     ) -> Iterator[tuple[str, str, Any, ToolTurnUpstream]]:
    """The proxy (PROXY_STUDY) in-process over :class:`ToolTurnUpstream`: (base URL, key,
    SQL runner, upstream)."""
    from flowtrial.instrumentation.proxy import serve_proxy
    from flowtrial.study.config import load_study
    from tests.agents.harness import _query, _study_db

    folder.mkdir(parents=True, exist_ok=True)
    study, db, key = _study_db(folder)
    upstream = ToolTurnUpstream(command)
    with serve_proxy(db, load_study(study), upstream=upstream) as px:
        yield px.base_url, key, _query(db), upstream
