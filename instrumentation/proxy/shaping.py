"""Latency shaping (docs/concepts/shaping.md): when each output token may be released.

A cycle's :class:`Target` (per arm, or per prompt from the draw) gives a floor on the first
output token (``ttft_ms``), a pace after it (``tokens_per_second``), optional log-normal
``jitter`` on the inter-token gaps (mean preserved) and ``delivery`` (``stream`` or
``all_at_once``). Output token 0 may be released at t_request + ttft; once it has been
written at t0, token k (k >= 1) may be released at

    due(k) = t0 + g_1 + … + g_k,   g_i = 1/tps · exp(σ·Z_i − σ²/2)

and goes out at max(upstream arrival of k, due(k)): the shaper only ever slows delivery.
When token 0 is on time, t0 = t_request + ttft and this is the documented
t_request + ttft + k/tps; pacing from the actual t0 keeps a few ms of lateness on the first
token from being "caught up" by a burst, so the pace the participant sees is the target pace.
Without ``ttft_ms`` token 0 goes out on arrival (a tokens/s-only arm is a pure rate limit).
``all_at_once`` releases the whole answer at t_request + ttft + n/tps (n = completion tokens).

"Output" means model output: answer text and tool-call arguments (an arm is a model speed,
and a model writes a call's arguments at the same pace as text). The TTFT floor holds the
first output event, text or a tool call's start; argument tokens take their places on the
schedule, but a tool-call event is never re-split (agents rely on deltas arriving intact):
it leaves whole once its last token is due. Tool calls are counted (``tool_calls``) and their
argument tokens are part of the timeline (experienced TTFT, pace, ``tokens_sent``).

**Manipulation violation.** ``violation_ms`` is how late the participant got the answer
against its schedule: the larger of (first output token written − due(0)) and (last output
token written − due(n−1)), clipped at 0, in ms — the miss on experienced TTFT and on the total
generation wait. (For ``all_at_once`` and non-streaming answers both are release − the one
due time.) It is recorded for every shaped cycle; ``violation`` is set when it exceeds
:data:`VIOLATION_TOLERANCE_MS` (5 ms), so event-loop scheduling noise (~1 ms) is not a
violation, but an upstream slower than the target — a late first token, a stream slower than
the pace — is, with the size of the miss. A mid-stream stall the schedule catches up on does
not count: the participant's TTFT and total wait were still on target.

**Time scale.** With ``study.time_scale`` = s > 1 the applied targets are compressed
(ttft/s, tps·s); cycles record the *applied* targets, analysis multiplies back.

All deadlines are absolute, on ``time.monotonic_ns()``, so a late wake-up is absorbed by the
next token instead of accumulating.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Literal

from flowtrial.study.config import ArmConfig, PerPromptSection

from .releases import precise_release
from .runtime_tuning import give_way

__all__ = ["RELEASE_SPIN_NS", "Pacer", "Target", "VIOLATION_TOLERANCE_MS", "sleep_until"]

VIOLATION_TOLERANCE_MS = 5.0
_monotonic_ns = time.monotonic_ns


@dataclass(frozen=True, slots=True)
class Target:
    """The latency profile applied to one cycle (already time-scaled)."""

    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    jitter: float = 0.0
    delivery: Literal["stream", "all_at_once"] = "stream"
    #: Display-frame granularity of the delivery (not time-scaled: it is the screen's and the
    #: proxy's real time); 0 = one write per token.
    frame_ms: float = 0.0

    @property
    def shaped(self) -> bool:
        return (
            self.ttft_ms is not None
            or self.tokens_per_second is not None
            or self.delivery == "all_at_once"
        )

    @classmethod
    def for_arm(cls, arm: ArmConfig, time_scale: float = 1.0) -> Target | None:
        """The arm's profile, compressed by ``time_scale``; None for an unshaped arm."""
        if not arm.shaped:
            return None
        return cls.scaled(arm.ttft_ms, arm.tokens_per_second, arm.jitter, arm.delivery,
                          time_scale, arm.frame_ms)

    @classmethod
    def for_draw(cls, pp: PerPromptSection, draw: dict[str, float | int | None],
                 time_scale: float = 1.0) -> Target:
        """The per-prompt draw's profile, compressed by ``time_scale``."""
        ttft = draw.get("ttft_ms")
        tps = draw.get("tokens_per_second")
        return cls.scaled(
            float(ttft) if ttft is not None else None,
            float(tps) if tps is not None else None,
            pp.jitter, pp.delivery, time_scale, pp.frame_ms,
        )

    @classmethod
    def scaled(cls, ttft_ms: float | None, tps: float | None, jitter: float,
               delivery: Literal["stream", "all_at_once"], time_scale: float,
               frame_ms: float = 0.0) -> Target:
        return cls(
            ttft_ms / time_scale if ttft_ms is not None else None,
            tps * time_scale if tps is not None else None,
            jitter,
            delivery,
            frame_ms,
        )


class Pacer:
    """Release times of one cycle's output tokens on the monotonic clock (ns).

    Token 0 is due at t_request + ttft (or on arrival without a floor); once it has gone out
    at time t0, token k is due at t0 + g_1 + … + g_k.
    """

    __slots__ = ("t_request", "base", "gap", "jitter", "all_at_once", "splits", "_cum", "_rng",
                 "ttft_ns", "frame_ns")

    def __init__(self, target: Target, t_request_ns: int, seed: str = "") -> None:
        self.t_request = t_request_ns
        self.ttft_ns = round(target.ttft_ms * 1e6) if target.ttft_ms is not None else None
        #: Release time of token 0 once it has gone out; None before.
        self.base: int | None = None
        tps = target.tokens_per_second
        self.gap = 1e9 / tps if tps else 0.0
        self.jitter = target.jitter if tps else 0.0
        self.all_at_once = target.delivery == "all_at_once"
        #: Token-sized pieces are only worth cutting when there is a pace to keep.
        self.splits = bool(tps) and not self.all_at_once
        #: Tokens due within one display frame leave together, when the pace has several
        #: tokens per frame (0: one write per token).
        frame_ns = round(target.frame_ms * 1e6)
        self.frame_ns = frame_ns if self.splits and self.gap < frame_ns else 0
        self._cum: list[float] = [0.0]
        self._rng = random.Random(seed) if self.jitter > 0 else None

    def first_due(self, arrival_ns: int) -> int:
        """When token 0 may go out: the TTFT floor, or its arrival when there is none."""
        if self.ttft_ns is None:
            return arrival_ns
        return self.t_request + self.ttft_ns

    def start(self, t_ns: int) -> None:
        """Token 0 went out at ``t_ns``: the pace runs from here."""
        if self.base is None:
            self.base = t_ns

    def due(self, k: int) -> int:
        """Release time of output token ``k`` >= 1 (after :meth:`start`)."""
        base = self.base if self.base is not None else self.first_due(self.t_request)
        return base + self.offset(k)

    def offset(self, k: int) -> int:
        """Time from token 0's release to token ``k``'s: g_1 + … + g_k (ns)."""
        if self._rng is None:
            return int(k * self.gap)
        cum = self._cum
        if len(cum) <= k:
            sd = self.jitter
            mu = -0.5 * sd * sd  # E[exp(N(mu, sd²))] = 1: the mean gap stays 1/tps
            rng = self._rng
            gap = self.gap
            while len(cum) <= k:
                cum.append(cum[-1] + gap * math.exp(rng.gauss(mu, sd)))
        return int(cum[k])

    def due_all(self, n_tokens: int) -> int:
        """Release time of a whole answer of ``n_tokens``: t_request + ttft + n/tps."""
        return self.t_request + (self.ttft_ns or 0) + int(n_tokens * self.gap)


# The first output token (and a whole held answer) is what the participant's experienced
# TTFT is measured on. Event-loop timers are millisecond-granular (uvloop's can fire early,
# asyncio's late), so for these releases the shaper sleeps to within this margin of the
# deadline and then yields to the loop until it is reached: median |TTFT error| drops from
# ~0.45 ms to ~0.08 ms at 100 streams (benchmarks/bench_proxy_shaping.py) for a few percent
# more CPU. Later tokens do not spin: their pace is measured over many tokens.
RELEASE_SPIN_NS = 1_500_000


async def sleep_until(deadline_ns: int, spin_ns: int = 0) -> None:
    """Sleep until the monotonic clock reaches ``deadline_ns`` (never wakes early).

    With ``spin_ns`` it is a precise release: the last ``spin_ns`` before the deadline are
    spent yielding to the event loop (other tasks keep running) rather than in a coarse
    timer, and the deadline is announced (:func:`precise_release`), so no older-generation
    collection lands on it and other waits give way to it. Without, the wait ends by giving
    way to any precise release due within
    :data:`~flowtrial.instrumentation.proxy.releases.GIVE_WAY_NS`.
    """
    if spin_ns:
        with precise_release(deadline_ns):
            await _sleep_until(deadline_ns, spin_ns)
    else:
        await _sleep_until(deadline_ns, 0)
        await give_way()


async def _sleep_until(deadline_ns: int, spin_ns: int) -> None:
    while True:
        remaining = deadline_ns - _monotonic_ns()
        if remaining <= 0:
            return
        if remaining <= spin_ns:
            await asyncio.sleep(0)
            continue
        await asyncio.sleep((remaining - spin_ns) / 1e9)
