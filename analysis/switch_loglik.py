"""Per-cycle log-likelihood of a counted switch (or none) under a logit, and per-person sums.

Every switch model's quadrature pass (the hinge, its gradual onsets, the smooth
alternatives) evaluates, for cycles × nodes, P(observed y) = d·expit(η) for a counted switch
and 1 − d·expit(η) otherwise (detection share d), with its score ∂log P/∂η, then sums over
each person's cycles. These are the passes that dominate a fit's time, so they live here
once, written for speed:

* `log_p` goes through one ``exp`` (e = e^(−s·η), s = ±1 the outcome's sign: P = 1/(1 + e),
  1 − P = e/(1 + e)) instead of scipy's ``expit``, which numpy's vectorised ``exp`` beats
  about fourfold on this machine (`benchmarks/bench_threshold_time.py` times the kernels);
* `row_sums` and `weight_rows` walk each person's contiguous block of rows: for wide rows
  (a dense pass's hundreds of nodes) summing the blocks one by one is about 4x faster here
  than ``np.add.reduceat`` along axis 0.
"""

from __future__ import annotations

import numpy as np

#: |η| is clipped here: e^80 is finite in float32 and float64, and a probability of e^−80
#: is already beyond anything a study can tell apart.
ETA_CLIP = 80.0
#: From this many values per row on, `row_sums` sums each block by itself (measured: with
#: 300 values per row 4x faster than reduceat, with 25 slower by 1.2–3x; even at 60–100).
WIDE_ROW = 64


def log_p(eta: np.ndarray, sign: np.ndarray | float, no_switch: np.ndarray | float, d: float,
          out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(log P(observed y), ∂log P/∂η) at linear predictors ``eta`` for outcome signs ``sign``
    (+1 a counted switch, −1 none; ``no_switch`` = 1 for none) and detection share ``d``.

    With ``out`` (an array of ``eta``'s shape and dtype) nothing is allocated when d = 1:
    ``eta`` is overwritten by the score and log P is written to ``out``."""
    neg = np.negative(sign)  # one value per row, or a scalar: negating η·s costs a pass
    if out is None:
        t = np.multiply(eta, neg)
        out = np.empty_like(t)
    else:
        t = np.multiply(eta, neg, out=eta)
    np.clip(t, -ETA_CLIP, ETA_CLIP, out=t)
    np.exp(t, out=t)  # e = (1 − P₁)/P₁ with P₁ = expit(s·η)
    np.add(t, 1.0, out=out)  # 1/P₁
    np.divide(t, out, out=t)  # 1 − P₁
    if d < 1.0:
        p1 = np.reciprocal(out, out=out)  # not 1 − (1 − P₁): that loses a tiny P₁
        m = p1 * d
        m += no_switch * (1.0 - d)  # P(observed y)
        t *= p1
        t *= d
        t /= m
        np.log(m, out=out)
    else:
        np.log(out, out=out)
        np.negative(out, out=out)
    t *= sign
    return out, t


def row_sums(a: np.ndarray, starts: np.ndarray, ends: np.ndarray,
             out: np.ndarray | None = None) -> np.ndarray:
    """Sums of ``a``'s rows over each block [starts[i], ends[i]), as float64, (blocks, …).
    The blocks are contiguous and not empty (ends[i] = starts[i + 1])."""
    if a[:1].size < WIDE_ROW:
        # Narrow rows (the hinge's active cycles × (v, s) nodes): reduceat is faster there.
        return np.add.reduceat(a, starts, axis=0, dtype=np.float64)
    if out is None:
        out = np.empty((starts.size, *a.shape[1:]))
    for i, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
        np.add.reduce(a[lo:hi], axis=0, dtype=np.float64, out=out[i])
    return out


def weight_rows(a: np.ndarray, weights: np.ndarray, starts: np.ndarray, ends: np.ndarray
                ) -> None:
    """Multiply each block of ``a``'s rows [starts[i], ends[i]) by ``weights[i]``, in place
    (a person's posterior weights over nodes, with no gather of them per row)."""
    for i, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
        a[lo:hi] *= weights[i]


__all__ = ["ETA_CLIP", "WIDE_ROW", "log_p", "row_sums", "weight_rows"]
