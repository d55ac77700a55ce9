"""Randomization: balanced blocks, Williams crossover sequences, per-prompt draws, SRM.

Everything is a pure function of the study seed and a position (enrollment index, request
index), so assignments can be recomputed and audited from the seed alone.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .config import ArmConfig, PerPromptSection, Range, StudyConfig

SRM_ALPHA = 0.001


def _rng(seed: int, *labels: object) -> np.random.Generator:
    """A generator derived from the study seed and labels (stable across runs and machines)."""
    digest = hashlib.sha256(repr((seed, *labels)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _block_pattern(weights: Sequence[float], max_block: int = 64) -> list[int]:
    """Arm indices for one block: integer multiples matching the allocation ratio."""
    ws = [float(w) for w in weights]
    for scale in range(1, max_block + 1):
        counts = [w * scale / min(ws) for w in ws]
        if all(abs(c - round(c)) < 1e-9 for c in counts) and sum(map(round, counts)) <= max_block:
            return [i for i, c in enumerate(counts) for _ in range(round(c))]
    # Irrational-looking ratios: approximate with the largest block allowed.
    total = sum(ws)
    sizes = [max(1, round(max_block * w / total)) for w in ws]
    return [i for i, c in enumerate(sizes) for _ in range(c)]


def parallel_arm(arms: Sequence[ArmConfig], seed: int, index: int) -> tuple[str, int]:
    """Arm of the participant enrolled at ``index`` (0-based), in permuted balanced blocks."""
    pattern = _block_pattern([a.weight for a in arms])
    block, pos = divmod(index, len(pattern))
    order = _rng(seed, "parallel", block).permutation(pattern)
    return arms[int(order[pos])].name, block


def williams_sequences(n: int) -> list[list[int]]:
    """Williams design: sequences balanced for first-order carry-over.

    For an even number of arms one Latin square (n sequences); for an odd number two squares
    (2n sequences, the second the mirror image of the first), so that every arm is preceded by
    every other arm equally often.
    """
    if n < 1:
        raise ValueError("need at least one arm")
    if n == 1:
        return [[0]]
    first = [0]
    lo, hi = 1, n - 1
    take_lo = True
    while len(first) < n:
        first.append(lo if take_lo else hi)
        if take_lo:
            lo += 1
        else:
            hi -= 1
        take_lo = not take_lo
    square = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2 == 0:
        return square
    return square + [list(reversed(row)) for row in square]


def crossover_arms(
    arms: Sequence[ArmConfig], seed: int, index: int, periods: int | None = None
) -> tuple[list[str], int, int]:
    """(arm per period, sequence number, block) for the participant enrolled at ``index``.

    Sequences are dealt out in permuted blocks of all Williams sequences, so every sequence
    is used equally often as participants enroll. With more periods than arms the sequence
    repeats.
    """
    seqs = williams_sequences(len(arms))
    block, pos = divmod(index, len(seqs))
    seq_no = int(_rng(seed, "crossover", block).permutation(len(seqs))[pos])
    seq = seqs[seq_no]
    n_periods = periods or len(arms)
    return [arms[seq[p % len(seq)]].name for p in range(n_periods)], seq_no, block


def _draw(r: Range, rng: np.random.Generator) -> float:
    u = float(rng.random())
    if r.scale == "log":
        return math.exp(math.log(r.min) + u * (math.log(r.max) - math.log(r.min)))
    return r.min + u * (r.max - r.min)


def per_prompt_draw(
    pp: PerPromptSection, seed: int, participant_id: str, request_index: int
) -> dict[str, float | int | None]:
    """The latency drawn for one request: log-uniform (or uniform) within the study ranges."""
    rng = _rng(seed, "per_prompt", participant_id, request_index)
    return {
        "ttft_ms": _draw(pp.ttft_ms, rng) if pp.ttft_ms else None,
        "tokens_per_second": _draw(pp.tokens_per_second, rng) if pp.tokens_per_second else None,
        "request_index": request_index,
    }


@dataclass(frozen=True)
class SRMResult:
    """Sample-ratio mismatch: observed arm counts against the planned proportions."""

    chi2: float
    p_value: float
    flagged: bool
    observed: dict[str, int]
    expected: dict[str, float]
    alpha: float = SRM_ALPHA
    unplanned: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.flagged

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "chi2": self.chi2,
            "p_value": self.p_value,
            "flagged": self.flagged,
            "observed": self.observed,
            "expected": self.expected,
            "alpha": self.alpha,
            "unplanned": self.unplanned,
        }


def srm_check(
    observed: Mapping[str, int], planned: Mapping[str, float], alpha: float = SRM_ALPHA
) -> SRMResult:
    """χ² goodness of fit of observed arm counts to planned proportions; flag if p < alpha.

    Counts in an arm that was never planned are a mismatch by themselves (flagged, p = 0).
    """
    names = list(planned)
    obs = np.array([observed.get(n, 0) for n in names], dtype=float)
    w = np.array([planned[n] for n in names], dtype=float)
    exp = w / w.sum() * obs.sum()
    unplanned = sorted(k for k, c in observed.items() if k not in planned and c > 0)
    chi2, p = 0.0, 1.0
    if unplanned:
        chi2, p = math.inf, 0.0
    elif obs.sum() > 0 and len(names) > 1:
        from scipy import stats  # imported here: scipy.stats costs ~1 s at proxy start-up

        chi2, p = (float(x) for x in stats.chisquare(obs, exp))
    return SRMResult(
        chi2,
        p,
        p < alpha,
        {**{n: int(o) for n, o in zip(names, obs, strict=True)},
         **{k: int(observed[k]) for k in unplanned}},
        {n: float(e) for n, e in zip(names, exp, strict=True)},
        alpha,
        unplanned,
    )


def srm_not_applicable(config: StudyConfig) -> str | None:
    """Why the sample-ratio check does not apply to this study (the one wording the report,
    ``flowtrial status`` and the dashboard use), or None when it does."""
    arms = config.allocated_arms
    if config.study.design == "per_prompt":
        return ("per-prompt design: every prompt draws its own latency, so there are no arms "
                "and no allocation ratio to check")
    if len(arms) < 2:
        return f"{config.study.design} design with one arm: no allocation ratio to check"
    return None
