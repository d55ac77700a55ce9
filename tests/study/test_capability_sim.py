"""Simulated models with a speed and a capability: attempts, decisions and the truth."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from flowtrial.study.config import (
    ConfigError,
    example_study_text,
    parse_study,
    speed_vs_capability_text,
)
from flowtrial.study.factorial import contrasts
from flowtrial.study.simulator import SimParams
from flowtrial.study.simulator.capability import SimModel, factorial_truth
from flowtrial.study.simulator.virtual import simulate_virtual_frames

MODELS = {"gpt-5.3-codex-spark": SimModel(ttft_ms=300, tokens_per_second=1000, success=0.4),
          "gpt-5.3-codex": SimModel(ttft_ms=12000, tokens_per_second=40, success=0.8)}


def config():  # noqa: ANN201
    return parse_study(tomllib.loads(speed_vs_capability_text()))


def test_template_identifies_speed_capability_and_naive() -> None:
    assert contrasts(config()) == {"speed": ("spark", "spark-slowed"),
                                   "capability": ("codex", "spark-slowed"),
                                   "naive": ("spark", "codex")}


@pytest.mark.parametrize("change, fragment", [
    ({"matched_to": "nope"}, "not another arm"),
    ({"matched_to": "spark-slowed"}, "not another arm"),
    ({"ttft_ms": None}, "stated prior"),
])
def test_matched_arm_is_validated(change: dict, fragment: str) -> None:
    data = tomllib.loads(speed_vs_capability_text())
    arm = next(a for a in data["arms"] if a["name"] == "spark-slowed")
    for k, v in change.items():
        if v is None:
            arm.pop(k)
        else:
            arm[k] = v
    with pytest.raises((ConfigError, ValueError), match=fragment):
        parse_study(data)


def test_matched_to_a_matched_arm_is_refused() -> None:
    data = tomllib.loads(example_study_text("crossover"))
    data["arms"][0].update(matched_to="slow")
    data["arms"][1].update(matched_to="fast")
    with pytest.raises((ConfigError, ValueError), match="itself matched"):
        parse_study(data)


def test_weaker_model_takes_more_attempts_and_matched_arm_gets_slow_latency() -> None:
    params = SimParams(models=MODELS, steps_per_task=2)
    f = simulate_virtual_frames(config(), params, 12, tasks=6, prompts_per_task=10, seed=3)
    cyc, tasks = f["cycles"], f["tasks"]
    per_task = cyc.groupby("task_id").size()
    arm_of = tasks.set_index("id")["arm"]
    attempts = per_task.groupby(arm_of.reindex(per_task.index).to_numpy()).mean()
    assert attempts["spark"] > attempts["codex"] + 1  # 2/0.4 = 5 vs 2/0.8 = 2.5 expected
    # Matched arm: the fast model slowed to codex's speed; the natural arms keep their own.
    ttft = cyc.groupby("arm")["experienced_ttft_ms"].median()
    assert ttft["spark"] < 400 and ttft["spark-slowed"] == pytest.approx(ttft["codex"], rel=0.01)
    # Every attempt is decided: good answers accepted, the rest rejected; a task ends on its
    # second good answer (or runs out of attempts and is abandoned).
    ev = f["events"]
    kinds = ev[ev["kind"].isin(["accept", "reject"])]
    assert len(kinds) == len(cyc)
    assert set(tasks["status"]) <= {"done", "abandoned"}
    done = tasks[tasks["status"] == "done"]["id"]
    accepted = kinds[kinds["kind"] == "accept"].merge(
        cyc[["id", "task_id"]], left_on="cycle_id", right_on="id")
    assert (accepted.groupby("task_id").size().reindex(done).to_numpy() == 2).all()
    # Task ends follow the last attempt; every task has one start and one end.
    assert (ev["kind"] == "task_end").sum() == len(tasks) == (ev["kind"] == "task_start").sum()


def test_factorial_truth_replays_the_same_people() -> None:
    params = SimParams(models=MODELS, steps_per_task=2)
    truth = factorial_truth(config(), params, 10, 4, 10, seed=5)
    per = truth["per_arm"]
    # Same model: same attempts (common random numbers); different model: fewer.
    assert per["spark"]["attempts_per_task"] == per["spark-slowed"]["attempts_per_task"]
    assert per["codex"]["attempts_per_task"] < per["spark"]["attempts_per_task"]
    c = truth["contrasts"]
    assert c["speed"] < 0  # faster delivery of the same model saves time
    lt = {k: v["mean_log_task_time"] for k, v in per.items()}
    assert c["speed"] == pytest.approx(np.expm1(lt["spark"] - lt["spark-slowed"]))
    assert c["capability"] == pytest.approx(np.expm1(lt["codex"] - lt["spark-slowed"]))


def test_fingerprint_of_studies_without_the_new_keys_is_unchanged() -> None:
    """Studies from before `model` / `matched_to` keep their randomization fingerprint (the
    hash of the arms as they were then), and setting the keys changes it."""
    import hashlib
    import json

    data = tomllib.loads(speed_vs_capability_text())
    for arm in data["arms"]:
        for key in ("upstream", "model", "matched_to", "matched_after"):
            arm.pop(key, None)
    old = parse_study(data)
    before = {"seed": old.study.seed, "design": old.study.design, "unit": old.study.unit,
              "arms": [{k: v for k, v in a.model_dump().items()
                        if k not in ("upstream", "model", "matched_to", "matched_after")}
                       for a in old.arms], "per_prompt": None}
    expected = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert old.randomization_fingerprint() == expected
    assert config().randomization_fingerprint() != expected
