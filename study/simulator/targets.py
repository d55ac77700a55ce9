"""What the study asks for each simulated cycle, and what the proxy would deliver.

:func:`study_targets` applies the study's randomization exactly as the proxy does
(per-prompt draws by request index, parallel/crossover arms by enrollment index);
:func:`experienced_latency` plays the proxy's shaper on a virtual clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..config import StudyConfig
from ..participants import PER_PROMPT_ARM
from ..randomization import crossover_arms, parallel_arm, per_prompt_draw
from .params import SimParams


@dataclass
class Targets:
    """What the study asks the proxy to do for each cycle (arrays of shape (P, K))."""

    arm: np.ndarray
    period: np.ndarray  # -1 = none (per-prompt)
    ttft_ms: np.ndarray  # NaN = unshaped
    tps: np.ndarray  # NaN = unshaped
    jitter: np.ndarray
    delivery: np.ndarray
    draw_json: np.ndarray
    shaped: np.ndarray
    task_arm: np.ndarray  # (P, T)
    task_period: np.ndarray  # (P, T)


def study_targets(
    config: StudyConfig,
    ids: list[str],
    first_index: int,
    n_tasks: int,
    prompts_per_task: int,
    design_seed: int | None = None,
) -> Targets:
    """Targets of every cycle, exactly as the study's randomization assigns them.

    Per-prompt draws use ``per_prompt_draw(seed, participant, request_index)`` with the
    0-based request index of the participant, as the proxy does; parallel and crossover arms
    follow the enrollment index. ``design_seed`` replaces the study seed (power analysis uses
    it so replicate studies get different draws).
    """
    seed = config.study.seed if design_seed is None else design_seed
    p, k = len(ids), n_tasks * prompts_per_task
    arm = np.empty((p, k), dtype=object)
    period = np.full((p, k), -1, dtype=np.int64)
    ttft = np.full((p, k), np.nan)
    tps = np.full((p, k), np.nan)
    jitter = np.zeros((p, k))
    delivery = np.empty((p, k), dtype=object)
    draw_json = np.full((p, k), None, dtype=object)
    shaped = np.ones((p, k), dtype=bool)
    task_arm = np.empty((p, n_tasks), dtype=object)
    task_period = np.full((p, n_tasks), -1, dtype=np.int64)
    task_of = np.arange(k) // prompts_per_task
    if config.study.design == "per_prompt":
        pp = config.per_prompt
        assert pp is not None  # guaranteed by StudyConfig validation
        arm[:] = PER_PROMPT_ARM
        task_arm[:] = PER_PROMPT_ARM
        jitter[:] = pp.jitter
        delivery[:] = pp.delivery
        for i, pid in enumerate(ids):
            for j in range(k):
                d = per_prompt_draw(pp, seed, pid, j)
                if d["ttft_ms"] is not None:
                    ttft[i, j] = d["ttft_ms"]
                if d["tokens_per_second"] is not None:
                    tps[i, j] = d["tokens_per_second"]
                draw_json[i, j] = json.dumps(d)
        return Targets(arm, period, ttft, tps, jitter, delivery, draw_json, shaped,
                       task_arm, task_period)
    for i in range(p):
        index = first_index + i
        if config.study.design == "parallel":
            names = [parallel_arm(config.arms, seed, index)[0]]
        else:
            names = crossover_arms(config.arms, seed, index, config.study.periods)[0]
        for t in range(n_tasks):
            per = t % len(names)
            task_arm[i, t] = names[per]
            task_period[i, t] = per
        arm[i] = task_arm[i, task_of]
        period[i] = task_period[i, task_of]
    targets = Targets(arm, period, ttft, tps, jitter, delivery, draw_json, shaped,
                      task_arm, task_period)
    apply_arms(config, targets)
    return targets


def apply_arms(config: StudyConfig, targets: Targets, only: str | None = None) -> None:
    """Fill each cycle's latency targets from its arm; with ``only``, first put every cycle
    and task in that arm (a counterfactual replay of the same people and tasks)."""
    if only is not None:
        targets.arm[:] = only
        targets.task_arm[:] = only
    for a in config.arms:
        m = targets.arm == a.name
        targets.ttft_ms[m] = np.nan if a.ttft_ms is None else a.ttft_ms
        targets.tps[m] = np.nan if a.tokens_per_second is None else a.tokens_per_second
        targets.jitter[m] = a.jitter
        targets.delivery[m] = a.delivery
        targets.shaped[m] = a.shaped


@dataclass
class Experienced:
    """What the participant experienced, raw (recorded) and real (behaviour) units."""

    ttft_raw_s: np.ndarray
    tps_raw: np.ndarray  # NaN when delivery is all at once (no pace after the first token)
    gen_wait_raw_s: np.ndarray
    upstream_first_raw_s: np.ndarray
    upstream_last_raw_s: np.ndarray  # the simulated model's last token reached the proxy
    violation: np.ndarray
    violation_ms: np.ndarray


def experienced_latency(
    config: StudyConfig, targets: Targets, n_tokens: np.ndarray, params: SimParams,
    rng: np.random.Generator, upstream: tuple[np.ndarray, np.ndarray] | None = None,
) -> Experienced:
    """The proxy's shaping on the virtual clock: max(upstream, target) plus a little noise.

    Targets are real (as in the study file); the proxy compresses them by ``time_scale``:
    a target TTFT t is served as t/S, a pace of v tokens/s as v·S. The upstream is the
    study's simulated model (``[upstream.mock]``), whose raw TTFT and pace can only slow
    delivery; when it is slower than the target the cycle is a manipulation violation.
    ``upstream`` gives each cycle its own model's raw TTFT (s) and pace instead (a study
    whose arms serve different models: :mod:`.capability`).
    """
    s = config.study.time_scale
    mock = config.upstream.mock
    shape = n_tokens.shape
    up_ttft: float | np.ndarray = mock.ttft_ms / 1000.0
    up_tps: float | np.ndarray = mock.tokens_per_second
    if upstream is not None:
        up_ttft, up_tps = upstream
    n = n_tokens.astype(float)
    target_ttft = targets.ttft_ms / 1000.0 / s  # raw s, NaN = none
    target_tps = targets.tps * s  # raw tokens/s, NaN = none
    overhead = rng.exponential(params.ttft_overhead_ms / 1000.0, shape)
    ttft = np.fmax(np.nan_to_num(target_ttft, nan=0.0), up_ttft) + overhead
    pace = np.fmin(np.nan_to_num(target_tps, nan=np.inf), up_tps)
    pace = pace * np.exp(-np.abs(params.tps_shortfall_sd * rng.standard_normal(shape)))
    all_at_once = targets.delivery == "all_at_once"
    held = ttft + n / pace
    gen_wait = np.where(all_at_once, held, ttft + (n - 1) / pace)
    ttft = np.where(all_at_once, held, ttft)
    # The upstream misses a target when its own first token or pace is slower than asked.
    miss_first = np.where(np.isnan(target_ttft), 0.0, np.maximum(0.0, up_ttft - target_ttft))
    target_end = np.nan_to_num(target_ttft, nan=0.0) + np.where(
        np.isnan(target_tps), 0.0, (n - 1) / np.where(np.isnan(target_tps), 1.0, target_tps)
    )
    upstream_end = up_ttft + (n - 1) / up_tps
    miss_end = np.where(np.isnan(target_tps) & np.isnan(target_ttft), 0.0,
                        np.maximum(0.0, upstream_end - target_end))
    miss = np.maximum(miss_first, np.where(np.isnan(target_tps), 0.0, miss_end))
    violation = targets.shaped & (miss > 0.0)
    up_first = np.full(shape, up_ttft) + overhead / 2
    return Experienced(
        ttft_raw_s=ttft,
        tps_raw=np.where(all_at_once, np.nan, pace),
        gen_wait_raw_s=gen_wait,
        upstream_first_raw_s=up_first,
        upstream_last_raw_s=up_first + np.maximum(n - 1, 0) / up_tps,
        violation=violation,
        violation_ms=np.where(violation, miss * 1000.0, np.nan),
    )
