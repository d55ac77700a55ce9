"""The behaviour model shared by virtual and live simulation.

Randomness comes in three independent streams derived from one seed, so that a virtual and
a live run with the same seed have the same people doing the same things (same crafting
times, same coin flips for switching, same times away); only the latency they experience
differs between the modes (virtual computes it, live measures it).

* ``draw_population``: who the participants are (reading speed, ψᵢ, ...), shape (P,).
* ``draw_behaviour``:   every per-cycle and per-task human draw, shape (P, K) / (P, T).
* the proxy-noise stream (virtual only): TTFT overhead and tps shortfall.

``cycle_timeline`` turns one cycle's experienced latency plus these draws into the times of
the switch, the return and the decision; both modes call it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .params import SimParams, switch_probability

__all__ = [
    "Behaviour",
    "Population",
    "cycle_timeline",
    "decide",
    "draw_behaviour",
    "draw_population",
    "rng_streams",
]


def rng_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """(population, behaviour, proxy-noise) generators, independent, derived from ``seed``."""
    pop, beh, noise = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(pop), np.random.default_rng(beh), np.random.default_rng(noise)


def _lognormal(rng: np.random.Generator, median: float | np.ndarray, logsd: float,
               size: tuple[int, ...] | int) -> np.ndarray:
    return np.exp(np.log(median) + logsd * rng.standard_normal(size))


@dataclass
class Population:
    """Per-participant parameters (the participant-level ground truth)."""

    ids: list[str]
    reading_tps: np.ndarray
    threshold_s: np.ndarray
    craft_median_s: np.ndarray
    verify_median_s: np.ndarray
    acceptance: np.ndarray
    partial_accept: np.ndarray
    switch_offset: np.ndarray | None = None  # random intercept uᵢ (logit); None = all 0

    def __len__(self) -> int:
        return len(self.ids)

    def truth_rows(self) -> list[dict[str, float]]:
        """One dict per participant for the ``ground_truth`` table."""
        return [
            {
                "reading_tps": float(self.reading_tps[i]),
                "threshold_s": float(self.threshold_s[i]),
                "prompt_crafting_median_s": float(self.craft_median_s[i]),
                "review_verify_median_s": float(self.verify_median_s[i]),
                "acceptance": float(self.acceptance[i]),
                "partial_accept": float(self.partial_accept[i]),
                "switch_offset": 0.0 if self.switch_offset is None
                else float(self.switch_offset[i]),
            }
            for i in range(len(self))
        ]


def draw_population(params: SimParams, ids: list[str], rng: np.random.Generator) -> Population:
    """Draw each participant's reading speed, threshold ψᵢ, habits and acceptance."""
    n = len(ids)
    k = params.acceptance_concentration
    acc = rng.beta(params.acceptance * k, (1 - params.acceptance) * k, size=n)
    # Keep accept + partial < 1 so the decision shares stay a probability distribution.
    acc = np.minimum(acc, 0.98 - params.partial_accept)
    pop = Population(
        ids=list(ids),
        reading_tps=_lognormal(rng, params.reading_tps, params.reading_tps_logsd, n),
        threshold_s=_lognormal(rng, params.threshold_s, params.threshold_logsd, n),
        craft_median_s=_lognormal(rng, params.prompt_crafting.median, params.person_logsd, n),
        verify_median_s=_lognormal(rng, params.review_verify.median, params.person_logsd, n),
        acceptance=acc,
        partial_accept=np.full(n, params.partial_accept),
    )
    # Drawn last, so studies without random intercepts keep their earlier draws per seed.
    if params.switch_intercept_sd > 0:
        pop.switch_offset = params.switch_intercept_sd * rng.standard_normal(n)
    return pop


@dataclass
class Behaviour:
    """Every human draw of a simulated study: arrays (P, K) per cycle, (P, T) per task.

    Cycle k belongs to task k // prompts_per_task.
    """

    n_tasks: int
    prompts_per_task: int
    n_tokens: np.ndarray  # response length asked for
    prompt_tokens: np.ndarray
    craft_s: np.ndarray
    verify_s: np.ndarray
    u_switch: np.ndarray  # switch iff u_switch < p(idle wait)
    switch_frac: np.ndarray  # where in the idle wait the switch happens
    away_s: np.ndarray
    resume_z: np.ndarray  # standard normal; resumption cost depends on the time away
    away_cat: np.ndarray  # index into categories
    away_app: np.ndarray  # index into that category's apps (modulo its length)
    u_decision: np.ndarray
    partial_frac: np.ndarray
    coding_s: np.ndarray  # own coding after the decision
    bg_switch: np.ndarray  # a switch unrelated to the assistant during own coding
    bg_frac: np.ndarray
    bg_away_s: np.ndarray
    bg_resume_z: np.ndarray
    bg_cat: np.ndarray
    bg_app: np.ndarray
    gap_s: np.ndarray  # (P, T): break before each task (0 for the first)
    forecast_noise: np.ndarray  # (P, T, 2): log-normal factors for fast/slow forecasts
    categories: list[str]

    @property
    def n_cycles(self) -> int:
        return self.n_tasks * self.prompts_per_task


def draw_behaviour(
    params: SimParams,
    pop: Population,
    n_tasks: int,
    prompts_per_task: int,
    rng: np.random.Generator,
    protocol: str = "chat",
) -> Behaviour:
    """Draw all per-cycle and per-task human randomness at once (vectorized)."""
    p, k = len(pop), n_tasks * prompts_per_task
    shape = (p, k)
    length = params.response_tokens_inline if protocol == "completions" else (
        params.response_tokens_chat
    )
    n_tokens = np.clip(np.rint(_lognormal(rng, length.median, length.logsd, shape)), 2, 8000)
    prompt_tokens = np.clip(
        np.rint(_lognormal(rng, params.prompt_tokens.median, params.prompt_tokens.logsd, shape)),
        1, 100_000,
    )
    craft = _lognormal(rng, pop.craft_median_s[:, None], params.prompt_crafting.logsd, shape)
    verify = _lognormal(rng, pop.verify_median_s[:, None], params.review_verify.logsd, shape)
    lo, hi = params.switch_at_fraction
    cats = list(params.away_weights)
    w = np.array([params.away_weights[c] for c in cats], dtype=float)
    w = w / w.sum()
    gap = _lognormal(rng, params.task_gap.median, params.task_gap.logsd, (p, n_tasks))
    gap[:, 0] = 0.0
    return Behaviour(
        n_tasks=n_tasks,
        prompts_per_task=prompts_per_task,
        n_tokens=n_tokens.astype(np.int64),
        prompt_tokens=prompt_tokens.astype(np.int64),
        craft_s=craft,
        verify_s=verify,
        u_switch=rng.random(shape),
        switch_frac=rng.uniform(lo, hi, shape),
        away_s=_lognormal(rng, params.time_away.median, params.time_away.logsd, shape),
        resume_z=rng.standard_normal(shape),
        away_cat=rng.choice(len(cats), size=shape, p=w),
        away_app=rng.integers(0, 1 << 30, shape),
        u_decision=rng.random(shape),
        partial_frac=rng.uniform(0.2, 0.8, shape),
        coding_s=_lognormal(rng, params.own_coding.median, params.own_coding.logsd, shape),
        bg_switch=rng.random(shape) < params.p_switch_while_coding,
        bg_frac=rng.uniform(0.1, 0.9, shape),
        bg_away_s=_lognormal(rng, params.time_away.median, params.time_away.logsd, shape),
        bg_resume_z=rng.standard_normal(shape),
        bg_cat=rng.choice(len(cats), size=shape, p=w),
        bg_app=rng.integers(0, 1 << 30, shape),
        gap_s=gap,
        forecast_noise=np.exp(params.forecast_logsd * rng.standard_normal((p, n_tasks, 2))),
        categories=cats,
    )


def resumption_s(params: SimParams, away_s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Resumption cost after returning: log-normal, median growing with the time away."""
    med = params.resumption.median * (
        np.asarray(away_s) / params.time_away.median
    ) ** params.resumption_growth
    return np.exp(np.log(med) + params.resumption.logsd * np.asarray(z))


def cycle_timeline(
    params: SimParams,
    *,
    ttft_s: np.ndarray,
    tps: np.ndarray,
    n_tokens: np.ndarray,
    idle_s: np.ndarray,
    reading_tps: np.ndarray,
    threshold_s: np.ndarray,
    u_switch: np.ndarray,
    switch_frac: np.ndarray,
    away_s: np.ndarray,
    resume_z: np.ndarray,
    verify_s: np.ndarray,
    all_at_once: np.ndarray | bool = False,
    switch_offset: np.ndarray | float | None = None,
) -> dict[str, np.ndarray]:
    """Times (real s after the request) of switch, return and decision for cycles.

    The switch decision uses the idle wait the participant experienced; the switch happens at
    ``switch_frac`` of it (so inside t_request..t_last_sent). On return the participant pays
    the resumption cost, then reads what is left (tokens read before leaving are
    approximated as (switch time − TTFT)·min(tps, reading speed)). Without a switch, reading
    ends at idle wait + n/r (see ``idle_wait_s``). The decision follows after review/verify.
    """
    p = switch_probability(idle_s, threshold_s, params,
                           offset=0.0 if switch_offset is None else switch_offset)
    switched = np.asarray(u_switch) < p
    r = np.asarray(reading_tps, dtype=float)
    n = np.asarray(n_tokens, dtype=float)
    pace = np.where(np.isfinite(tps) & (np.asarray(tps) > 0), tps, np.inf)
    switch_at = np.asarray(switch_frac) * idle_s
    back_at = switch_at + away_s
    resume = resumption_s(params, away_s, resume_z)
    read_before = np.where(
        np.asarray(all_at_once, dtype=bool), 0.0,
        np.clip((switch_at - ttft_s) * np.minimum(pace, r), 0.0, n),
    )
    finish_plain = idle_s + n / r
    finish_switched = np.maximum(finish_plain, back_at + resume + (n - read_before) / r)
    finish = np.where(switched, finish_switched, finish_plain)
    return {
        "p_switch": p,
        "switched": switched,
        "switch_at": switch_at,
        "back_at": back_at,
        "resume": resume,
        "read_end": finish,
        "decision_at": finish + verify_s,
    }


def decide(
    u: np.ndarray, acceptance: np.ndarray, partial: np.ndarray
) -> np.ndarray:
    """Decision kinds: accept with the person's acceptance, then partial_accept, else reject."""
    return np.where(
        u < acceptance, "accept", np.where(u < acceptance + partial, "partial_accept", "reject")
    )


def task_forecasts(beh: Behaviour, pop: Population) -> tuple[np.ndarray, np.ndarray]:
    """METR-style forecasts (real s, shape (P, T)) with and without the fast assistant.

    Forecasts are made before randomization, so they use only the latency-free parts of the
    work (crafting, reading, verifying, own coding), with log-normal forecast error; people
    expect the slow condition to take 15 % longer.
    """
    p, m = len(pop), beh.prompts_per_task
    human = (beh.craft_s + beh.n_tokens / pop.reading_tps[:, None] + beh.verify_s
             + beh.coding_s).reshape(p, beh.n_tasks, m).sum(axis=2)
    return human * beh.forecast_noise[:, :, 0], human * beh.forecast_noise[:, :, 1] * 1.15
