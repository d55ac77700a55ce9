"""Live simulation through the real proxy, against a virtual run of the same seed."""

from __future__ import annotations

import json
import math
import tomllib

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from flowtrial.live_simulation import simulate_live
from flowtrial.study.config import StudyConfig, example_study_text, parse_study
from flowtrial.study.simulator import SimParams, simulate_virtual_frames
from flowtrial.study.storage import init_db

pytest.importorskip("flowtrial.instrumentation.proxy.server")

SCALE = 150.0
N, TASKS, PROMPTS, SEED = 6, 2, 6, 2024


def live_config() -> StudyConfig:
    data = tomllib.loads(example_study_text())
    data["study"].update(name="live-vs-virtual", seed=77, time_scale=SCALE)
    data["per_prompt"] = {"ttft_ms": {"min": 1000, "max": 40000}}
    data["upstream"]["mock"] = {"tokens_per_second": 1e6, "ttft_ms": 0}
    return parse_study(data)


def _index(df: pd.DataFrame) -> pd.Series:
    """The participant's request index (0-based, in request order)."""
    return df.sort_values("t_request_ns").groupby("participant_id").cumcount().reindex(df.index)


def _decisions(events: pd.DataFrame) -> pd.DataFrame:
    d = events[events["kind"].isin(["accept", "reject", "partial_accept"])]
    return d[["cycle_id", "kind"]].rename(columns={"kind": "decision"})


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    config = live_config()
    db = init_db(tmp_path_factory.mktemp("live") / "live.db", config)
    progress: list[int] = []
    res = simulate_live(db, config, SimParams(), N, TASKS, PROMPTS, SEED,
                        progress=lambda d, _t: progress.append(d))
    with db.engine.connect() as c:
        tables = {t: pd.read_sql(f"SELECT * FROM {t}", c)
                  for t in ("cycles", "events", "tasks", "ground_truth", "participants")}
    return {"config": config, "res": res, "progress": progress, **tables}


def test_live_run_writes_linked_records(live_run: dict) -> None:
    res, cyc, ev = live_run["res"], live_run["cycles"], live_run["events"]
    assert res.extra["event_errors"] == [] and res.extra["request_errors"] == 0
    assert live_run["progress"][-1] == N * TASKS * PROMPTS
    assert len(cyc) == N * TASKS * PROMPTS and (cyc["status"] == "ok").all()
    assert set(cyc["participant_id"]) == set(live_run["participants"]["id"])
    assert live_run["participants"]["simulated"].all()
    # Every cycle got exactly one decision naming it; focus events name their cycle and fall
    # inside its wait (between t_request and t_last_sent, on the wall clock).
    dec = _decisions(ev)
    assert sorted(dec["cycle_id"]) == sorted(cyc["id"])
    outs = ev[(ev["kind"] == "focus_out") & ev["cycle_id"].notna()].merge(
        cyc, left_on="cycle_id", right_on="id")
    wall = outs["wall_anchor_ns"] - outs["mono_anchor_ns"]
    assert (outs["ts_ns"] >= wall + outs["t_request_ns"]).all()
    assert (outs["ts_ns"] <= wall + outs["t_last_sent_ns"]).all()
    assert (ev["kind"] == "focus_out").sum() == (ev["kind"] == "focus_in").sum()
    payloads = ev.loc[ev["kind"] == "focus_out", "payload_json"].map(json.loads)
    assert payloads.map(lambda p: p["category"] in {"browser", "chat", "mail"}).all()
    # Tasks: rows with start and end, their events, and the cycles linked to them.
    tasks = live_run["tasks"]
    assert len(tasks) == N * TASKS and (tasks["status"] == "done").all()
    assert (tasks["ended_at_ns"] > tasks["started_at_ns"]).all()
    assert (ev["kind"] == "task_start").sum() == N * TASKS == (ev["kind"] == "task_end").sum()
    assert cyc["task_id"].notna().all()
    per_task = cyc.groupby("task_id").size()
    assert (per_task == PROMPTS).all()
    # Ground truth of the live run.
    gt = live_run["ground_truth"]
    pop = json.loads(gt.loc[gt["scope"] == "population", "params_json"].iloc[0])
    assert pop["mode"] == "live" and pop["seed"] == SEED
    assert (gt["scope"] == "participant").sum() == N
    # The proxy met the (time-compressed) shaping targets, up to what this machine's timer
    # made unavoidable during the run (see study.simulator.timing).
    # (Bounded as in test_demo: implausible for a 1 % rate plus the machine's timer noise.)
    late = res.extra["timer_late_rate"]
    assert late is not None
    k, n = int(cyc["violation"].sum()), len(cyc)
    assert stats.binom.sf(k - 1, n, 0.01 + 5 * late) > 0.01, (k, n, late)


def test_live_and_virtual_runs_agree(live_run: dict) -> None:
    config = live_config()
    frames = simulate_virtual_frames(config, SimParams(), N, TASKS, PROMPTS, seed=SEED)
    live, virt = live_run["cycles"].copy(), frames["cycles"].copy()
    live["k"], virt["k"] = _index(live), _index(virt)
    live = live.merge(_decisions(live_run["events"]), left_on="id", right_on="cycle_id")
    virt = virt.merge(_decisions(frames["events"]), left_on="id", right_on="cycle_id")
    for df, events in ((live, live_run["events"]), (virt, frames["events"])):
        outs = events[(events["kind"] == "focus_out") & events["cycle_id"].notna()]
        df["switched"] = df["id"].isin(set(outs["cycle_id"]))
        df["ttft_s"] = df["experienced_ttft_ms"] / 1000 * SCALE
    m = live.merge(virt, on=["participant_id", "k"], suffixes=("_live", "_virt"))
    assert len(m) == N * TASKS * PROMPTS
    # Same seed: the proxy drew the same per-prompt latencies the virtual run assumed ...
    assert np.allclose(m["target_ttft_ms_live"], m["target_ttft_ms_virt"])
    # ... the participants made the same decisions (same people, same coin flips) ...
    assert (m["decision_live"] == m["decision_virt"]).all()
    # ... and experienced statistically indistinguishable waits and switched alike.
    ks = stats.ks_2samp(m["ttft_s_live"], m["ttft_s_virt"])
    assert ks.pvalue > 0.05, ks
    assert (m["ttft_s_live"] - m["ttft_s_virt"]).abs().median() < 0.3  # real seconds
    n = len(m)
    p1, p2 = m["switched_live"].mean(), m["switched_virt"].mean()
    pooled = (p1 + p2) / 2
    z = (p1 - p2) / math.sqrt(max(pooled * (1 - pooled), 1e-9) * 2 / n)
    assert abs(z) < 2.58, (p1, p2)
    assert (m["switched_live"] == m["switched_virt"]).mean() > 0.9


def test_live_person_acts_on_the_recorded_wait(live_run: dict) -> None:
    """The simulated person's idle wait is the one the proxy recorded, not the client's
    later view of it (time_scale would turn the client's lag into seconds of extra wait
    and bias the threshold low)."""
    from flowtrial.study.timeline import idle_wait_s

    obs = live_run["res"].extra["observed"]
    gt = live_run["ground_truth"]
    reading = {r.participant_id: json.loads(r.params_json)["reading_tps"]
               for r in gt[gt["scope"] == "participant"].itertuples()}
    m = obs.merge(live_run["cycles"], left_on="cycle_id", right_on="id")
    assert len(m) == N * TASKS * PROMPTS
    recorded = idle_wait_s(m["experienced_ttft_ms"] / 1000 * SCALE, m["n_tokens"],
                           m["achieved_tps"] / SCALE, m["participant_id_x"].map(reading))
    assert np.allclose(m["idle_wait_s"], recorded, rtol=1e-6, atol=1e-3)
    # The client saw its first token later than the proxy sent it.
    client = m["ttft_raw_s"] * 1000
    assert (client >= m["experienced_ttft_ms"] - 0.5).all()


def test_live_crossover_follows_the_started_task(tmp_path) -> None:
    """The proxy picks the crossover arm from the task the simulator started."""
    data = tomllib.loads(example_study_text("crossover"))
    data["study"].update(name="live-crossover", design="crossover", unit="task",
                         time_scale=200)
    data["upstream"]["mock"] = {"tokens_per_second": 1e6, "ttft_ms": 0}
    config = parse_study(data)
    db = init_db(tmp_path / "x.db", config)
    res = simulate_live(db, config, SimParams(), 2, 2, 2, seed=5)
    assert res.extra["event_errors"] == [] and res.cycles == 8
    with db.engine.connect() as c:
        cyc = pd.read_sql("SELECT * FROM cycles", c)
        tasks = pd.read_sql("SELECT * FROM tasks", c)
    m = cyc.merge(tasks, left_on="task_id", right_on="id", suffixes=("", "_task"))
    assert len(m) == 8 and (m["arm"] == m["arm_task"]).all()
    assert (m["period"] == m["period_task"]).all()
    assert m.groupby("participant_id")["arm"].nunique().eq(2).all()  # both arms, one per task
    targets = {a.name: a.ttft_ms / 200 for a in config.arms}
    assert np.allclose(m["target_ttft_ms"], m["arm"].map(targets))


def test_live_agent_turns_build_real_turns(tmp_path) -> None:
    """--agent-steps 3 live: each prompt is a human request, two tool calls by the simulated
    model, two continuations after the tool's run time, and the answer; the proxy's tracker
    files them into one turn each, which `rebuild_turns` reproduces."""
    from flowtrial.study.turns import rebuild_turns

    steps, n, prompts = 3, 3, 4
    config = live_config()
    db = init_db(tmp_path / "agent.db", config)
    res = simulate_live(db, config, SimParams(), n, 1, prompts, seed=11, agent_steps=steps)
    assert res.extra["event_errors"] == [] and res.extra["request_errors"] == 0
    assert res.cycles == n * prompts * steps
    obs = res.extra["observed"]
    assert (obs["calls"] == steps).all() and (obs["tool_s"] > 0).all()
    cols = ("id, participant_id, first_cycle_id, last_cycle_id, model_calls, tool_calls, "
            "side_calls, retries, status, t_start_ns, t_end_ns, wait_ms, model_ms, tool_ms, "
            "gap_ms, injected_ms, mono_anchor_ns, wall_anchor_ns")
    with db.engine.connect() as c:
        cyc = pd.read_sql("SELECT * FROM cycles ORDER BY participant_id, t_request_ns", c)
        turns = pd.read_sql(f"SELECT {cols} FROM turns ORDER BY id", c)
        events = pd.read_sql("SELECT * FROM events", c)
    assert (cyc["status"] == "ok").all()
    kinds = cyc.groupby("participant_id")["request_kind"].agg(list)
    assert all(k == (["human"] + ["continuation"] * (steps - 1)) * prompts for k in kinds), kinds
    assert list(cyc["tool_calls"]) == ([1] * (steps - 1) + [0]) * (n * prompts)
    assert len(turns) == n * prompts and (turns["status"] == "complete").all()
    assert (turns["model_calls"] == steps).all() and (turns["tool_calls"] == steps - 1).all()
    assert (turns["side_calls"] == 0).all() and (turns["retries"] == 0).all()
    assert cyc.groupby("turn_id").size().eq(steps).all()
    # The proxy's tool time holds at least the tool runs the participants acted out (raw ms).
    by_final = obs.set_index("cycle_id")["tool_s"] / SCALE * 1000
    tool = turns.set_index("last_cycle_id")["tool_ms"]
    assert (tool > 0).all() and (tool >= by_final.reindex(tool.index) - 1.0).all()
    assert ((turns["wait_ms"] - turns["model_ms"] - turns["tool_ms"] - turns["gap_ms"]).abs()
            < 0.01).all()
    # One decision per turn, naming its final answer.
    dec = _decisions(events)
    assert sorted(dec["cycle_id"]) == sorted(turns["last_cycle_id"])
    # Switches happen during the whole turn (tool time included), and name its final call.
    outs = events[(events["kind"] == "focus_out") & events["cycle_id"].notna()].merge(
        turns, left_on="cycle_id", right_on="last_cycle_id")
    wall = outs["wall_anchor_ns"] - outs["mono_anchor_ns"]
    assert len(outs) >= 1 and len(outs) == obs["switched"].sum()
    assert (outs["ts_ns"] >= wall + outs["t_start_ns"]).all()
    assert (outs["ts_ns"] <= wall + outs["t_end_ns"]).all()
    assert rebuild_turns(db) == len(turns)
    with db.engine.connect() as c:
        again = pd.read_sql(f"SELECT {cols} FROM turns ORDER BY id", c)
    pd.testing.assert_frame_equal(again, turns)
