"""Matched latency: an arm that delivers another arm's *measured* TTFT and tokens/s
(docs/researchers/speed-vs-capability.md#matched-latency).

Each request of a matched arm draws one recorded (experienced TTFT, achieved tokens/s) pair
from the matched arm's latest ok cycles, so the fast model is slowed to the distribution the
slow model really delivered, not to a single number. Until the matched arm has recorded
``matched_after`` cycles the arm's stated prior (its ``ttft_ms`` / ``tokens_per_second``) is
used. The draw and its source are recorded in the cycle's ``draw_json``.

The sample is read in a worker thread, at most every ``refresh_s`` seconds (every
:data:`PRIOR_REFRESH_S` while an arm is still on its prior), and never while a request
waits: a draw only picks from the sample already in memory.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Engine, text

from flowtrial.study.config import ArmConfig, StudyConfig

from .shaping import Target

__all__ = ["MatchedLatency"]

#: Recorded cycles of the matched arm kept in the sample (the latest ones).
SAMPLE_SIZE = 500
#: While an arm still delivers its prior, its sample is re-read this often (s), so it
#: switches to recorded latencies soon after the matched arm has enough.
PRIOR_REFRESH_S = 2.0
_SAMPLE = text(
    "SELECT experienced_ttft_ms, achieved_tps FROM cycles WHERE arm = :arm AND status = 'ok' "
    "AND experienced_ttft_ms IS NOT NULL AND achieved_tps IS NOT NULL AND achieved_tps > 0 "
    "AND (request_kind IS NULL OR request_kind = 'human') "
    "ORDER BY t_request_ns DESC LIMIT :n"
)


@dataclass(frozen=True, slots=True)
class MatchedDraw:
    target: Target
    draw_json: str


class MatchedLatency:
    """Per matched arm, a sample of its matched arm's recorded latencies to draw from."""

    def __init__(self, config: StudyConfig, engine: Engine, *, refresh_s: float = 30.0,
                 seed: int | None = None) -> None:
        self.engine = engine
        self.time_scale = config.study.time_scale
        self.refresh_s = refresh_s
        self.arms: dict[str, ArmConfig] = {a.name: a for a in config.arms if a.matched_to}
        self._samples: dict[str, list[tuple[float, float]]] = {n: [] for n in self.arms}
        self._refreshed_at = float("-inf")
        self._refreshing = False
        self._lock = threading.Lock()
        self._rng = random.Random(seed)

    def __contains__(self, arm: str) -> bool:
        return arm in self.arms

    def refresh(self) -> None:
        """Read every matched arm's sample (blocking: call it in a thread)."""
        samples = {}
        with self.engine.connect() as conn:
            for name, arm in self.arms.items():
                rows = conn.execute(_SAMPLE, {"arm": arm.matched_to, "n": SAMPLE_SIZE}).all()
                samples[name] = [(float(t), float(v)) for t, v in rows]
        with self._lock:
            self._samples.update(samples)
            self._refreshed_at = time.monotonic()
            self._refreshing = False

    def _maybe_refresh(self) -> None:
        """Start a refresh in a worker thread when the sample is stale (never waits)."""
        with self._lock:
            on_prior = any(len(self._samples[n]) < a.matched_after for n, a in self.arms.items())
            every = min(self.refresh_s, PRIOR_REFRESH_S) if on_prior else self.refresh_s
            if self._refreshing or time.monotonic() - self._refreshed_at < every:
                return
            self._refreshing = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.refresh()
            return
        fut = loop.run_in_executor(None, self.refresh)
        fut.add_done_callback(self._refresh_done)

    def _refresh_done(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            with self._lock:  # try again on a later request
                self._refreshing = False
                self._refreshed_at = time.monotonic()

    def draw(self, arm: str) -> MatchedDraw:
        """One request's target: a recorded pair of the matched arm, or the prior."""
        self._maybe_refresh()
        cfg = self.arms[arm]
        with self._lock:
            sample = self._samples[arm]
            pair = self._rng.choice(sample) if len(sample) >= cfg.matched_after else None
        if pair is None:
            target = Target.for_arm(cfg, self.time_scale)
            assert target is not None  # a matched arm is shaped (config validation)
            info = {"matched_to": cfg.matched_to, "source": "prior",
                    "recorded": len(sample), "ttft_ms": cfg.ttft_ms,
                    "tokens_per_second": cfg.tokens_per_second}
        else:
            # Recorded raw (compressed by time_scale) like every time: already what the
            # proxy serves.
            raw_ttft, raw_tps = pair
            target = Target(ttft_ms=raw_ttft, tokens_per_second=raw_tps, jitter=cfg.jitter,
                            delivery=cfg.delivery, frame_ms=float(cfg.frame_ms))
            info = {"matched_to": cfg.matched_to, "source": "recorded",
                    "recorded": len(sample), "ttft_ms": raw_ttft * self.time_scale,
                    "tokens_per_second": raw_tps / self.time_scale}
        return MatchedDraw(target, json.dumps(info, sort_keys=True))
