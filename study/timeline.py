"""Shared definitions of the cycle timeline (docs/concepts/timeline.md), used by simulator
and analysis.

Keeping them in one place means the simulator generates switches from exactly the wait the
analysis later measures.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

DEFAULT_READING_TPS = 5.3  # Brysbaert 2019: 238 words/min ≈ 5.3 tokens/s
NS = 1_000_000_000


def idle_wait_s(
    ttft_s: ArrayLike,
    n_tokens: ArrayLike,
    tokens_per_second: ArrayLike,
    reading_tps: ArrayLike = DEFAULT_READING_TPS,
) -> np.ndarray:
    """The part of the wait with nothing new to read.

    TTFT plus the time by which delivery lags behind reading: a reader at ``reading_tps``
    would finish ``n`` tokens ``n / reading_tps`` after the first one, delivery ends
    ``n / tokens_per_second`` after it, so the lag is ``max(0, n/tps − n/reading)``.
    A non-positive or missing ``tokens_per_second`` (all-at-once delivery, or a one-token
    answer) adds no lag: everything arrived at once.
    """
    ttft = np.asarray(ttft_s, dtype=float)
    n = np.asarray(n_tokens, dtype=float)
    tps = np.asarray(tokens_per_second, dtype=float)
    read = np.asarray(reading_tps, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        deliver = np.where(np.isfinite(tps) & (tps > 0), n / tps, 0.0)
        lag = np.maximum(0.0, deliver - n / read)
    return ttft + np.nan_to_num(lag)


def wall_ns(t_ns: ArrayLike, mono_anchor_ns: ArrayLike, wall_anchor_ns: ArrayLike) -> np.ndarray:
    """Convert proxy monotonic ns to UTC epoch ns with the recording process's anchor."""
    return (
        np.asarray(wall_anchor_ns, dtype=np.int64)
        + np.asarray(t_ns, dtype=np.int64)
        - np.asarray(mono_anchor_ns, dtype=np.int64)
    )
