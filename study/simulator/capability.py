"""Models with a speed and a capability: the ground truth of a speed-vs-capability study
(docs/researchers/speed-vs-capability.md).

Each arm of such a study names a model (``[[arms]] model``) and a latency: the model's own
(``natural``), explicit targets, or another arm's measured latency (``matched_to``). The
simulator gives every model of :attr:`SimParams.models` a natural speed and a capability:

* **speed**: the model's own TTFT and tokens/s (real seconds, as a person experiences
  them). A natural arm is served at it; a matched arm is slowed to its matched arm's model;
* **capability**: the chance that one answer does what the person asked. A task needs
  ``steps_per_task`` good answers; every prompt is an *attempt*, accepted when good and
  rejected otherwise, and the person prompts again until the task has its good answers or
  the attempts run out (``prompts_per_task``: the task is then abandoned).

So a weaker model costs more attempts, each of which is as fast as its arm: exactly the
"five attempts in the time one takes" trade the study separates. One uniform number per
attempt slot decides success for every model (common random numbers), so the same people
and tasks can be replayed under every arm: :func:`factorial_truth` does that and returns
what each contrast really is for the simulated sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..config import StudyConfig
from ..factorial import contrasts

if TYPE_CHECKING:
    from .params import SimParams
    from .targets import Targets

#: Spawn key of the attempts' random stream (independent of population, behaviour, noise).
_ATTEMPT_STREAM = 33


class SimModel(BaseModel):
    """A model a simulated study serves: its capability and, unless the arm's upstream is a
    simulated model of its own speed (``[upstreams.NAME.mock]``), its natural speed."""

    model_config = ConfigDict(extra="forbid")
    success: float = Field(gt=0, le=1)  # P(one answer does what was asked)
    ttft_ms: float | None = Field(default=None, gt=0)
    tokens_per_second: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class LiveAttempts:
    """Live simulation: whether attempt ``k`` of participant ``i`` is good under an arm's
    model (the same uniform numbers as the virtual plan: common random numbers)."""

    u: np.ndarray  # (P, K)
    success: dict[str, float]  # arm -> P(good answer)
    steps: int

    def good(self, i: int, k: int, arm: str) -> bool:
        return bool(self.u[i, k] < self.success.get(arm, 1.0))


def live_attempts(config: StudyConfig, params: SimParams, n_participants: int,
                  n_cycles: int, seed: int) -> LiveAttempts | None:
    """The live counterpart of :func:`attempt_plan` (None without models)."""
    if not params.models:
        return None
    rng = np.random.default_rng(np.random.SeedSequence([seed, _ATTEMPT_STREAM]))
    return LiveAttempts(u=rng.random((n_participants, n_cycles)),
                        success={a: m.success for a, m in arm_models(config, params).items()},
                        steps=params.steps_per_task)


def natural_speed_raw(config: StudyConfig, params: SimParams, arm_name: str
                      ) -> tuple[float, float]:
    """An arm's model's own raw TTFT (s) and pace: its simulated upstream's (what the proxy
    would serve), else the simulator's model speed, else the study's ``[upstream.mock]``."""
    arm = config.arm(arm_name)
    s = config.study.time_scale
    named = config.upstreams.get(arm.upstream) if arm.upstream else None
    if named is not None and named.kind == "mock":
        return named.mock.ttft_ms / 1000.0, named.mock.tokens_per_second
    m = params.models.get(arm.model or "")
    if m is not None and m.ttft_ms is not None and m.tokens_per_second is not None:
        return m.ttft_ms / 1000.0 / s, m.tokens_per_second * s
    return config.upstream.mock.ttft_ms / 1000.0, config.upstream.mock.tokens_per_second


@dataclass
class AttemptPlan:
    """Which attempt slots a task uses: arrays (P, K) per slot, (P, T) per task."""

    used: np.ndarray
    success: np.ndarray
    attempts: np.ndarray
    completed: np.ndarray

    def last_used(self, prompts_per_task: int) -> np.ndarray:
        """(P, K) bool: the last attempt of each task."""
        p, k = self.used.shape
        idx = np.arange(prompts_per_task)[None, None, :]
        last = idx == (self.attempts[..., None] - 1)
        return last.reshape(p, k)


def arm_models(config: StudyConfig, params: SimParams) -> dict[str, SimModel]:
    """Arm name -> the simulated model it serves (every arm must name one of ``models``)."""
    out: dict[str, SimModel] = {}
    for arm in config.arms:
        if arm.model is None or arm.model not in params.models:
            known = ", ".join(params.models) or "none"
            raise ValueError(f"arm {arm.name!r} serves model {arm.model!r}, which the "
                             f"simulator's models do not describe (known: {known})")
        out[arm.name] = params.models[arm.model]
    return out


def model_speed(config: StudyConfig, params: SimParams, targets: Targets
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Per cycle, the serving model's own raw TTFT (s) and pace (tokens/s), or None when the
    simulator describes no models (then the study's one ``[upstream.mock]`` serves all)."""
    if not params.models:
        return None
    ttft = np.full(targets.arm.shape, np.nan)
    tps = np.full(targets.arm.shape, np.nan)
    for name in arm_models(config, params):
        mask = targets.arm == name
        ttft[mask], tps[mask] = natural_speed_raw(config, params, name)
    return ttft, tps


def match_targets(config: StudyConfig, params: SimParams, targets: Targets) -> None:
    """A matched arm's targets become its matched arm's model speed (what the proxy would
    have measured from that arm's cycles, which the virtual model serves exactly)."""
    if not params.models:
        return
    s = config.study.time_scale
    for arm in config.arms:
        if arm.matched_to is None:
            continue
        ttft_raw, tps_raw = natural_speed_raw(config, params, arm.matched_to)
        mask = targets.arm == arm.name
        targets.ttft_ms[mask] = ttft_raw * 1000.0 * s  # targets are real
        targets.tps[mask] = tps_raw / s


def attempt_plan(config: StudyConfig, params: SimParams, targets: Targets, n_tasks: int,
                 prompts_per_task: int, seed: int) -> AttemptPlan | None:
    """Which attempts each task needs under its arm's model (None without models)."""
    if not params.models:
        return None
    models = arm_models(config, params)
    p, k = targets.arm.shape
    q = np.ones((p, k))
    for name, m in models.items():
        q[targets.arm == name] = m.success
    rng = np.random.default_rng(np.random.SeedSequence([seed, _ATTEMPT_STREAM]))
    success = (rng.random((p, k)) < q).reshape(p, n_tasks, prompts_per_task)
    good = np.cumsum(success, axis=2)
    used = np.less(good - success, params.steps_per_task)  # still short of its good answers
    return AttemptPlan(
        used=used.reshape(p, k),
        success=(success & used).reshape(p, k),
        attempts=used.sum(axis=2),
        completed=good[..., -1] >= params.steps_per_task,
    )


def factorial_truth(config: StudyConfig, params: SimParams, n_participants: int,
                    tasks: int, prompts_per_task: int, seed: int, **same: Any
                    ) -> dict[str, Any]:
    """The same people and tasks replayed under every arm (common random numbers): per
    arm the mean log task time, attempts and completion; per contrast of
    :func:`flowtrial.study.factorial.contrasts` its true effect, exp(mean log-time
    difference) − 1, for this sample. ``same``: the participants' ids and indices, so the
    replay is of the same people."""
    from .virtual import simulate_virtual_frames

    per_arm: dict[str, dict[str, float]] = {}
    log_time: dict[str, np.ndarray] = {}
    for arm in config.arms:
        frames = simulate_virtual_frames(config, params, n_participants, tasks,
                                         prompts_per_task, seed, force_arm=arm.name, **same)
        t = frames["tasks"]
        secs = (t["ended_at_ns"] - t["started_at_ns"]).to_numpy(float) / 1e9 \
            * config.study.time_scale
        log_time[arm.name] = np.log(secs)
        per_arm[arm.name] = {
            "mean_log_task_time": float(np.mean(np.log(secs))),
            "median_task_time_s": float(np.median(secs)),
            "attempts_per_task": float(frames["cycles"].groupby("task_id").size().mean()),
            "completed_share": float((t["status"] == "done").mean()),
        }
    truth = {k: float(np.expm1(np.mean(log_time[a] - log_time[b])))
             for k, (a, b) in contrasts(config).items()}
    return {"per_arm": per_arm, "contrasts": truth, "participants": n_participants,
            "tasks_per_participant": tasks, "seed": seed,
            "estimand": "exp(mean over the sample's tasks of log T(arm) − log T(reference)) − 1"}
