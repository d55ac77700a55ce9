"""One simulated generation: the answer text for a request and when each token is released."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from ..tokens import split_tokens
from .corpus import Corpus, guess_language
from .inbound import Turn
from .structured import json_answer
from .tool_steps import ToolCall

__all__ = ["Generation", "Job", "Schedule", "generate"]

Finish = Literal["stop", "stop_sequence", "length"]


@dataclass(frozen=True)
class Generation:
    """The answer for one request, fixed before anything is sent."""

    text: str
    pieces: tuple[str, ...]  # split_tokens(text): the unit of pacing and of usage
    finish: Finish
    stop_sequence: str | None
    prompt_tokens: int

    @property
    def output_tokens(self) -> int:
        return len(self.pieces)


def generate(turn: Turn, corpus: Corpus, seed: int,
             answer_tokens: tuple[int, int] | None = None) -> Generation:
    """Choose and cut the answer for `turn`; the same seed and request give the same text.

    `answer_tokens` (lo, hi): a prose answer is exactly N tokens, N drawn from [lo, hi] for
    the request (further corpus answers appended, the last one cut), so fast arms can be
    measured on long answers; the request's own max_tokens still caps it ("length").
    """
    # surrogatepass: a prompt may hold a lone surrogate (JSON "\udfff"); it still has a digest.
    digest = hashlib.blake2b(turn.key.encode("utf-8", "surrogatepass"),
                             digest_size=16).hexdigest()
    rng = random.Random(f"{seed}/{digest}")
    long: list[str] | None = None
    if turn.schema is not None:  # structured output: JSON that fits the schema, not prose
        source = json_answer(turn.schema, turn.focus_text)
    else:
        language = guess_language(turn.focus_text)
        source = corpus.pick(rng, code_only=turn.code_only, language=language).text
        if answer_tokens is not None:
            long = _long_answer(source, rng, corpus, turn, language, answer_tokens)
            source = "".join(long)
    finish: Finish = "stop"
    text, stop_sequence = source, None
    # Earliest stop sequence wins; searching from index 1 keeps the answer non-empty.
    hits = [(i, s) for s in turn.stop if (i := text.find(s, 1)) > 0]
    if hits:
        cut, stop_sequence = min(hits)
        text, finish, long = text[:cut], "stop_sequence", None
    pieces = long if long is not None else split_tokens(text)
    if turn.max_tokens is not None and len(pieces) > turn.max_tokens:
        pieces = pieces[: turn.max_tokens]
        text, finish, stop_sequence = "".join(pieces), "length", None
    return Generation(text, tuple(pieces), finish, stop_sequence, turn.prompt_tokens)


def _long_answer(source: str, rng: random.Random, corpus: Corpus, turn: Turn,
                 language: str | None, answer_tokens: tuple[int, int]) -> list[str]:
    """`source` extended with further draws (blank line between), cut to N tokens."""
    target = rng.randint(*answer_tokens)
    text = source
    # Re-split the whole text each time: a join can merge the tokens either side of it.
    while len(pieces := split_tokens(text)) < target:
        text += "\n\n" + corpus.pick(rng, code_only=turn.code_only, language=language).text
    return pieces[:target]


class Schedule:
    """Absolute release times: content token k is due at start + ttft + k / tokens_per_second.

    Times are measured against `time.monotonic()` from a fixed start, so sleep overshoot in
    one step is absorbed by the next instead of accumulating. When the event loop wakes up
    late (sleeps are ~1 ms granular), every token already due goes out in one delta.
    """

    def __init__(self, start: float, ttft_s: float, tokens_per_second: float) -> None:
        self.start = start
        self.first = start + ttft_s
        self.gap = 0.0 if math.isinf(tokens_per_second) else 1.0 / tokens_per_second

    def due(self, k: int) -> float:
        """Monotonic time at which token k (0-based) may be released."""
        return self.first + k * self.gap

    async def sleep_until(self, when: float) -> None:
        """Sleep until `when` on the monotonic clock, never waking early."""
        # Loop because uvloop's timers run off a cached millisecond loop clock and can fire
        # up to ~1 ms before the deadline; a token must never go out before it is due.
        while (delay := when - time.monotonic()) > 0:
            # asyncio directly (what uvicorn runs): anyio's first sleep lazily imports its
            # backend, a ~30 ms stall that would land inside the first reply's schedule.
            await asyncio.sleep(delay)

    async def paced(self, pieces: tuple[str, ...]) -> AsyncIterator[str]:
        """Yield the pieces as deltas on schedule (several per delta when they are due)."""
        i, n = 0, len(pieces)
        while i < n:
            await self.sleep_until(self.due(i))
            elapsed = time.monotonic() - self.first
            ready = n if self.gap == 0 else int(elapsed / self.gap) + 1
            j = min(n, max(i + 1, ready))
            yield "".join(pieces[i:j])
            i = j


@dataclass(frozen=True)
class Job:
    """Everything a wire format needs to render one reply."""

    turn: Turn
    gen: Generation
    id: str
    created: int
    schedule: Schedule
    item_id: str = ""  # Responses: id of the output message item
    stream_id: str | None = None  # Responses WebSocket lane, echoed on every event
    tool_call: ToolCall | None = None  # answer with this tool call instead of the text
