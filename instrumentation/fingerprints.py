"""Winnowed k-gram fingerprints (MOSS-style) of prompts and answers.

A study that does not keep content still needs to tell whether a completion *persisted*
(docs/concepts/capture.md): a later prompt of the same participant contains most of an earlier
answer. Fingerprints answer that without storing the text:

1. normalize: drop all whitespace (re-indentation and reflowing must not change the print);
2. hash every k-gram of characters (k = 25) with a polynomial hash mod 2**64 (computed for all
   k-grams at once from one prefix sum), then mix the value (a multiply-xorshift round) and keep
   its high 32 bits — stable across processes and machines (Python's ``hash`` is salted per
   process, so it is not used);
3. winnow (Schleimer, Wilkerson & Aiken 2003): in every window of w = 20 consecutive hashes
   keep the minimum (the rightmost one on ties); each position is kept once.

Any shared substring of at least ``k + w - 1`` = 44 non-whitespace characters is guaranteed
to share at least one selected hash. The work is a few dozen numpy vector operations
whatever the length (~0.1 ms for a 1 kB answer); the proxy runs it in its writer thread.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["K", "W", "fingerprint", "fingerprint_json", "similarity"]

K = 25  # characters per k-gram
W = 20  # hashes per winnowing window

_BASE = np.uint64(1_000_003)
_M1 = np.uint64(0xFF51AFD7ED558CCD)


def _normalize(text: str) -> str:
    # str.split() drops every (Unicode) whitespace run; ~10x faster than re.sub(r"\s+", "").
    return "".join(text.split())


_S33, _S32, _S29 = np.uint64(33), np.uint64(32), np.uint64(29)
_LOW = np.uint64(0xFFFFFFFF)


def _mix(h: np.ndarray) -> np.ndarray:
    # One multiply-xorshift round (the first half of murmur3's fmix64): enough to spread the
    # low input bits into the high 32 bits that are kept. In place: h is a fresh temporary.
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S29
    return h


_MASK = (1 << 64) - 1
_POW: np.ndarray = np.ones(1, dtype=np.uint64)  # _BASE ** i mod 2**64, grown on demand
_INV: np.ndarray = np.ones(1, dtype=np.uint64)  # _BASE ** -i mod 2**64 (the base is odd)


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    global _POW, _INV
    if len(_POW) < n:
        size = max(n, 2 * len(_POW), 4096)
        inv = pow(int(_BASE), -1, 1 << 64)
        with np.errstate(over="ignore"):
            _POW = np.cumprod(np.concatenate(
                [[np.uint64(1)], np.full(size - 1, _BASE, dtype=np.uint64)]), dtype=np.uint64)
            _INV = np.cumprod(np.concatenate(
                [[np.uint64(1)], np.full(size - 1, np.uint64(inv), dtype=np.uint64)]),
                dtype=np.uint64)
    return _POW, _INV


def _kgram_hashes(norm: str, k: int) -> np.ndarray:
    """Polynomial hash of every k-gram, mod 2**64, from one prefix sum (a handful of vector
    operations whatever k is): sum_j c_j B^(i+k-1-j) = B^(i+k-1) * (S[i+k] - S[i]) with
    S the prefix sums of c_j * B^-j."""
    # Code points fit in 32 bits (+1 too); multiplying by the uint64 powers widens them.
    codes = np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32) + np.uint32(1)
    n = len(codes)
    pw, inv = _powers(n + 1)
    with np.errstate(over="ignore"):
        prefix = np.empty(n + 1, dtype=np.uint64)
        prefix[0] = 0
        np.cumsum(np.multiply(codes, inv[:n], dtype=np.uint64), out=prefix[1:])
        h = prefix[k:] - prefix[: n - k + 1]
        h *= pw[k - 1 : n]
        h = _mix(h)
        h >>= _S32
        return h


def fingerprint(text: str, k: int = K, w: int = W) -> list[int]:
    """The winnowed hashes of ``text`` in order of position (empty for blank text).

    Text shorter than ``k`` characters (after dropping whitespace) is one k-gram of itself.
    """
    norm = _normalize(text)
    if not norm:
        return []
    hashes = _kgram_hashes(norm, min(k, len(norm)))
    if len(hashes) <= w:
        return [int(hashes[len(hashes) - 1 - int(np.argmin(hashes[::-1]))])]
    # Sort key = hash in the high half, *reversed* position in the low half: the minimum key
    # of a window is its smallest hash and, on ties, the rightmost occurrence.
    low = _LOW
    keys = hashes << _S32
    keys |= low - np.arange(len(hashes), dtype=np.uint64)
    positions = (low - (_sliding_min(keys, w) & low)).astype(np.intp)
    # Rightmost minima never move left as the window slides: dedupe by neighbours.
    keep = np.empty(len(positions), dtype=bool)
    keep[0] = True
    np.not_equal(positions[1:], positions[:-1], out=keep[1:])
    return hashes[positions[keep]].tolist()


def _sliding_min(x: np.ndarray, w: int) -> np.ndarray:
    """min(x[i:i+w]) for every i, by doubling spans (log2(w) vector ops, not w)."""
    out, span = x, 1
    while span * 2 <= w:
        out = np.minimum(out[:-span], out[span:])
        span *= 2
    n = len(x) - w + 1
    if span < w:
        out = np.minimum(out[:n], out[w - span : w - span + n])
    return out[:n]


_JSON = json.JSONEncoder(separators=(",", ":"))


def fingerprint_json(text: str) -> str:
    """The fingerprint as a compact JSON list, as stored on a cycle."""
    return _JSON.encode(fingerprint(text))


def similarity(a: list[int], b: list[int]) -> float:
    """Containment of ``a`` in ``b``: the share of a's distinct hashes that b also has.

    1.0 means everything fingerprinted in ``a`` appears in ``b`` (``a`` persisted in ``b``);
    0.0 for an empty ``a``.
    """
    sa = set(a)
    if not sa:
        return 0.0
    return len(sa & set(b)) / len(sa)
