"""What a live simulated participant does on the wire: one prompt, streamed back; or, for
an agent turn (``flowtrial simulate --mode live --agent-steps K``), the prompt offering a
harmless tool, the simulated model's tool calls (``[upstream] tool_steps``) each answered
after the tool's run time with a continuation carrying its result, until the final answer.

The participant's clock starts when the turn's first request leaves (an httpx event hook),
so the wait it measures is the whole turn: every model call and every tool run.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

LIVE_MODEL = "flowtrial-sim-1"
CYCLE_ID_HEADER = "x-flowtrial-cycle-id"

#: The one tool a simulated agent offers: the simulated model's tool steps call listers first.
LIST_DIR_TOOL = {
    "type": "function",
    "function": {
        "name": "list_dir",
        "description": "List the files in a directory of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]},
    },
}
_LISTING = "README.md\npyproject.toml\nsrc/\ntests/\n"


class Clock:
    """Acts out real durations compressed by time_scale, against one monotonic origin.

    For a request the origin is the moment httpx hands it to the connection (an event
    hook), so the SDK's own request building does not count as waiting.
    """

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.mark()

    def mark(self) -> None:
        self.t0 = time.perf_counter()
        self.wall0 = time.time_ns()

    def raw_now(self) -> float:
        return time.perf_counter() - self.t0

    def wall_at(self, raw_s: float) -> int:
        return self.wall0 + int(raw_s * 1e9)

    async def until_raw(self, raw_s: float) -> None:
        delay = raw_s - self.raw_now()
        if delay > 0:
            await asyncio.sleep(delay)


class Hooks:
    """httpx event hooks: when the turn's first request left and when headers came back."""

    def __init__(self) -> None:
        self.clock: Clock | None = None
        self.armed = False  # the next request starts the clock (the turn's first)
        self.headers_at: float | None = None

    def start(self, clock: Clock) -> None:
        self.clock, self.armed, self.headers_at = clock, True, None

    async def on_request(self, request: Any) -> None:
        if self.clock is not None and self.armed and request.url.path.endswith(
                "/chat/completions"):
            self.clock.mark()
            self.armed = False

    async def on_response(self, response: Any) -> None:
        if (self.clock is not None and self.headers_at is None
                and response.request.url.path.endswith("/chat/completions")):
            self.headers_at = self.clock.raw_now()


@dataclass
class TurnResult:
    """What the participant saw of one turn (times on the turn's clock, raw seconds)."""

    cycle_ids: list[str | None] = field(default_factory=list)  # each call's, in order
    arrivals: list[float] = field(default_factory=list)  # the final answer's content chunks
    counts: list[int] = field(default_factory=list)
    usage: int | None = None
    headers_at: float = 0.0
    tool_raw_s: float = 0.0  # tool time acted out
    error: str | None = None

    @property
    def final_cycle_id(self) -> str | None:
        return self.cycle_ids[-1] if self.cycle_ids else None


async def run_turn(client: Any, hooks: Hooks, clock: Clock, prompt: str, n_ask: int,
                   tool_raw_s: list[float]) -> TurnResult:
    """Send the prompt and follow the model through its tool calls to the final answer.

    ``tool_raw_s`` is each tool's run time (compressed); with it empty the request offers
    no tool (a chat cycle). A model that keeps calling tools past the list is given the last
    duration again, up to 100 calls.
    """
    import openai

    from flowtrial.instrumentation.tokens import count_tokens

    out = TurnResult()
    hooks.start(clock)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    extra: dict[str, Any] = {"tools": [LIST_DIR_TOOL]} if tool_raw_s else {}
    try:
        for step in range(100):
            calls: dict[int, dict[str, Any]] = {}
            async with client.chat.completions.with_streaming_response.create(
                model=LIVE_MODEL, messages=messages, stream=True, max_tokens=n_ask,
                stream_options={"include_usage": True}, **extra,
            ) as resp:
                if step == 0:
                    out.headers_at = (hooks.headers_at if hooks.headers_at is not None
                                      else clock.raw_now())
                out.cycle_ids.append(resp.headers.get(CYCLE_ID_HEADER))
                stream = await resp.parse()
                async for chunk in stream:
                    now = clock.raw_now()
                    if chunk.usage is not None:
                        out.usage = chunk.usage.completion_tokens
                    for choice in chunk.choices:
                        delta = choice.delta
                        if delta and delta.content:
                            out.arrivals.append(now)
                            out.counts.append(count_tokens(delta.content))
                        for tc in (delta.tool_calls or []) if delta else []:
                            c = calls.setdefault(tc.index, {"id": None, "name": "",
                                                            "arguments": ""})
                            c["id"] = tc.id or c["id"]
                            if tc.function is not None:
                                c["name"] += tc.function.name or ""
                                c["arguments"] += tc.function.arguments or ""
            if not calls or out.arrivals:
                return out  # the final answer
            # Run the tool(s), then hand the results back: a continuation.
            wait = tool_raw_s[min(step, len(tool_raw_s) - 1)]
            await asyncio.sleep(wait)
            out.tool_raw_s += wait
            ordered = [calls[i] for i in sorted(calls)]
            messages = [*messages, {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": c["id"], "type": "function",
                                "function": {"name": c["name"], "arguments": c["arguments"]}}
                               for c in ordered]}]
            messages += [{"role": "tool", "tool_call_id": c["id"],
                          "content": _LISTING if c["name"] == "list_dir"
                          else json.dumps({"error": "unknown tool"})} for c in ordered]
        out.error = "the model kept calling tools (100 calls)"
    except openai.APIError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out
