"""Virtual simulation: the generated switch curves match the truth formulas; tables are sound."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flowtrial.study.config import StudyConfig, example_study_text, parse_study
from flowtrial.study.randomization import per_prompt_draw
from flowtrial.study.simulator import SimParams, simulate_virtual, simulate_virtual_frames
from flowtrial.study.simulator.summary import study_glance
from flowtrial.study.storage import init_db
from flowtrial.study.timeline import idle_wait_s


def wide_config(**study: object) -> StudyConfig:
    """A per-prompt study whose waits span the threshold widely, with slow paces too (so the
    idle wait differs from the TTFT: delivery slower than reading adds to it)."""
    data = tomllib.loads(example_study_text())
    data["study"].update(study)
    data["per_prompt"] = {"ttft_ms": {"min": 300, "max": 60000},
                          "tokens_per_second": {"min": 2, "max": 80}}
    data["upstream"]["mock"] = {"tokens_per_second": 1e6, "ttft_ms": 0.5}
    return parse_study(data)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def expected_p(truth: str, w: np.ndarray, psi: np.ndarray, pop: dict) -> np.ndarray:
    """The documented formulas, written out independently of the simulator's code."""
    p_low, p_high, m = pop["params"]["p_low"], pop["params"]["p_high"], pop["params"][
        "hinge_multiple"]
    x = np.log(w) - np.log(psi)
    if truth == "hinge":
        a = _logit(p_low)
        b = (_logit(p_high) - a) / math.log(m)  # p_high exactly at m·ψ
        eta = a + b * np.maximum(0.0, x)
    elif truth == "smooth":
        lo, hi = _logit(p_low), _logit(p_high)  # through (ψ/m, p_low) and (m·ψ, p_high)
        eta = (lo + hi) / 2 + (hi - lo) / (2 * math.log(m)) * x
    else:
        return np.full(w.shape, pop["params"]["p_flat"])
    return 1 / (1 + np.exp(-eta))


def switch_curve_from_tables(frames: dict[str, pd.DataFrame], scale: float) -> pd.DataFrame:
    """Per cycle, from the stored tables only: idle wait (analysis definition, at the
    participant's stored reading speed), ψᵢ, and whether focus left during the wait."""
    c = frames["cycles"]
    gt = frames["ground_truth"]
    people = {r.participant_id: json.loads(r.params_json)
              for r in gt[gt["scope"] == "participant"].itertuples()}
    reading = c["participant_id"].map(lambda p: people[p]["reading_tps"]).to_numpy(float)
    psi = c["participant_id"].map(lambda p: people[p]["threshold_s"]).to_numpy(float)
    w = idle_wait_s(c["experienced_ttft_ms"].to_numpy(float) / 1000 * scale,
                    c["tokens_completion"].to_numpy(float),
                    c["achieved_tps"].to_numpy(float) / scale, reading)
    ev = frames["events"]
    outs = ev[(ev["kind"] == "focus_out") & ev["cycle_id"].notna()]
    # Every in-wait switch falls between t_request and t_last_sent.
    joined = outs.merge(c, left_on="cycle_id", right_on="id")
    wall0 = joined["wall_anchor_ns"] - joined["mono_anchor_ns"]
    assert (joined["ts_ns"] > wall0 + joined["t_request_ns"]).all()
    assert (joined["ts_ns"] < wall0 + joined["t_last_sent_ns"]).all()
    return pd.DataFrame({"w": w, "psi": psi, "switched": c["id"].isin(set(outs["cycle_id"]))})


@pytest.mark.parametrize("truth", ["hinge", "smooth", "flat"])
@pytest.mark.parametrize("threshold_sd", [0.0, 0.35])
def test_switch_rate_curve_matches_truth_formula(truth: str, threshold_sd: float) -> None:
    config = wide_config(seed=11)
    params = SimParams(truth=truth, threshold_logsd=threshold_sd)
    frames = simulate_virtual_frames(config, params, 160, 4, 25, seed=5)
    pop = json.loads(frames["ground_truth"].query("scope == 'population'").params_json.iloc[0])
    assert pop["truth_model"] == truth
    d = switch_curve_from_tables(frames, config.study.time_scale)
    d["p"] = expected_p(truth, d["w"].to_numpy(), d["psi"].to_numpy(), pop)
    edges = np.exp(np.linspace(np.log(0.3), np.log(70), 11))
    d["bin"] = np.digitize(d["w"], edges)
    checked = 0
    for _, g in d.groupby("bin"):
        n = len(g)
        if n < 150:
            continue
        expected = g["p"].mean()
        se = math.sqrt(max(expected * (1 - expected), 1e-4) / n)
        observed = g["switched"].mean()
        assert abs(observed - expected) < 4.5 * se, (truth, g["w"].median(), observed, expected)
        checked += 1
    assert checked >= 7
    # The curve's shape: flat stays flat, the others rise from p_low to far above it.
    lo, hi = d[d["w"] < 2], d[d["w"] > 32]
    if truth == "flat":
        assert abs(lo["switched"].mean() - hi["switched"].mean()) < 0.06
    else:
        assert lo["switched"].mean() < 0.06 < 0.3 < hi["switched"].mean()
    if truth == "hinge" and threshold_sd == 0.0:
        # Below ψ the hinge is flat at p_low: waits of 1 s and 6 s switch alike.
        a = d[(d["w"] > 0.5) & (d["w"] < 1.5)]["switched"].mean()
        b = d[(d["w"] > 4) & (d["w"] < 7.5)]["switched"].mean()
        assert abs(a - b) < 0.03 and abs(b - 0.03) < 0.02


def test_idle_wait_drives_switching_not_ttft() -> None:
    """With slow paces the idle wait exceeds the TTFT; the model must follow the idle wait."""
    config = wide_config(seed=3)
    frames = simulate_virtual_frames(config, SimParams(threshold_logsd=0.0), 120, 4, 25, seed=9)
    truth = frames["cycle_truth"]
    c = frames["cycles"]
    ttft = c["experienced_ttft_ms"].to_numpy() / 1000
    # Short TTFT but a long lag behind reading: switches like a long wait would.
    lagging = (ttft < 3) & (truth["idle_wait_s"].to_numpy() > 24)
    quick = (ttft < 3) & (truth["idle_wait_s"].to_numpy() < 3)
    assert lagging.sum() > 200 and quick.sum() > 200
    assert truth["switched"][lagging].mean() > truth["switched"][quick].mean() + 0.2


def test_virtual_database_tables(tmp_path: Path) -> None:
    config = wide_config(seed=7, time_scale=10)
    db = init_db(tmp_path / "sim.db", config)
    res = simulate_virtual(db, config, SimParams(), 6, tasks=3, prompts_per_task=5, seed=42)
    assert res.cycles == 6 * 3 * 5 and res.tasks == 18
    with db.engine.connect() as conn:
        cyc = pd.read_sql("SELECT * FROM cycles", conn)
        ev = pd.read_sql("SELECT * FROM events", conn)
        tasks = pd.read_sql("SELECT * FROM tasks", conn)
        parts = pd.read_sql("SELECT * FROM participants", conn)
        gt = pd.read_sql("SELECT * FROM ground_truth", conn)
    assert parts["simulated"].all() and len(parts) == 6
    assert cyc["simulated"].all() and (cyc["protocol"] == "chat").all()
    assert (cyc["mono_anchor_ns"] == 0).all() and cyc["wall_anchor_ns"].nunique() == 1
    # The cycle timeline (docs/concepts/timeline.md) is ordered.
    assert (cyc["t_request_ns"] < cyc["t_first_sent_ns"]).all()
    assert (cyc["t_first_sent_ns"] <= cyc["t_last_sent_ns"]).all()
    assert (cyc["t_last_sent_ns"] < cyc["t_done_ns"]).all()
    # Targets are the study's per-prompt draws (request index = the participant's count),
    # recorded raw like the proxy does (ttft / time_scale); achieved ≈ target.
    for row in cyc.sample(20, random_state=1).itertuples():
        k = int(row.id.rsplit("c", 1)[1]) - 1
        draw = per_prompt_draw(config.per_prompt, 7, row.participant_id, k)
        assert row.target_ttft_ms == pytest.approx(draw["ttft_ms"] / 10)
        assert row.target_tps == pytest.approx(draw["tokens_per_second"] * 10)
        assert json.loads(row.draw_json)["ttft_ms"] == pytest.approx(draw["ttft_ms"])
    over = cyc["experienced_ttft_ms"] - cyc["target_ttft_ms"]
    assert (over >= 0).all() and over.median() < 2.0
    assert not cyc["violation"].any()
    # Decisions: one per cycle, linked; focus events come in out/in pairs.
    dec = ev[ev["kind"].isin(["accept", "reject", "partial_accept"])]
    assert sorted(dec["cycle_id"]) == sorted(cyc["id"])
    assert (ev["kind"] == "focus_out").sum() == (ev["kind"] == "focus_in").sum()
    outs = ev[ev["kind"] == "focus_out"]
    payloads = outs["payload_json"].map(json.loads)
    assert payloads.map(lambda p: p["category"] in {"browser", "chat", "mail"}).all()
    assert (ev["source"] == "simulator").all()
    # Tasks contain their cycles; task_start/task_end events match the rows.
    merged = cyc.merge(tasks, left_on="task_id", right_on="id", suffixes=("", "_t"))
    wall = merged["wall_anchor_ns"] + merged["t_request_ns"]
    assert ((wall > merged["started_at_ns"]) & (wall < merged["ended_at_ns"])).all()
    assert (ev["kind"] == "task_start").sum() == 18 == (ev["kind"] == "task_end").sum()
    assert tasks["forecast_fast_s"].gt(0).all() and (tasks["status"] == "done").all()
    # Ground truth: the population row and every participant's parameters.
    assert (gt["scope"] == "population").sum() == 1
    assert set(gt.loc[gt["scope"] == "participant", "participant_id"]) == set(parts["id"])
    pop = json.loads(gt.loc[gt["scope"] == "population", "params_json"].iloc[0])
    assert pop["seed"] == 42 and pop["threshold_s"] == 8.0 and pop["time_scale"] == 10
    # A second run adds new participants instead of colliding.
    res2 = simulate_virtual(db, config, SimParams(), 2, tasks=1, prompts_per_task=2, seed=1)
    assert res2.participants == ["sim-007", "sim-008"]


def test_time_scale_is_undone_by_the_recorded_scale(tmp_path: Path) -> None:
    """Raw times × time_scale give the same real waits and decisions as an unscaled run."""
    base = simulate_virtual_frames(wide_config(seed=2), SimParams(), 20, 2, 10, seed=8)
    fast = simulate_virtual_frames(wide_config(seed=2, time_scale=25), SimParams(), 20, 2, 10,
                                   seed=8)
    a, b = base["cycles"], fast["cycles"]
    assert np.allclose(a["target_ttft_ms"], b["target_ttft_ms"] * 25)
    # Only the proxy's few ms of raw overhead differ (and are magnified by the scale).
    assert np.allclose(a["experienced_ttft_ms"], b["experienced_ttft_ms"] * 25, rtol=0.01,
                       atol=25 * 15)
    span_a = (a["t_request_ns"].max() - a["t_request_ns"].min())
    span_b = (b["t_request_ns"].max() - b["t_request_ns"].min())
    assert span_b * 25 == pytest.approx(span_a, rel=0.01)
    agree = (base["cycle_truth"]["switched"] == fast["cycle_truth"]["switched"]).mean()
    assert agree > 0.98


def test_parallel_and_crossover_designs() -> None:
    text = example_study_text("parallel")
    par = parse_study({**tomllib.loads(text), "study": {"name": "p", "design": "parallel",
                                                         "seed": 4}})
    fr = simulate_virtual_frames(par, SimParams(), 8, 2, 5, seed=1)
    arms = fr["cycles"].groupby("participant_id")["arm"].unique()
    assert all(len(a) == 1 for a in arms) and sorted(fr["cycles"]["arm"].unique()) == [
        "fast", "slow"]
    slow = fr["cycles"][fr["cycles"]["arm"] == "slow"]
    assert np.allclose(slow["target_ttft_ms"], 8000) and np.allclose(slow["target_tps"], 50)
    cro = parse_study({**tomllib.loads(text), "study": {"name": "c", "design": "crossover",
                                                         "unit": "task", "seed": 4}})
    fr = simulate_virtual_frames(cro, SimParams(), 4, 2, 3, seed=1)
    per_task = fr["tasks"].groupby("participant_id")["arm"].agg(list)
    assert all(sorted(a) == ["fast", "slow"] for a in per_task)
    c = fr["cycles"].merge(fr["tasks"], left_on="task_id", right_on="id")
    assert (c["arm_x"] == c["arm_y"]).all() and (c["period_x"] == c["period_y"]).all()


def test_glance_reports_rising_switch_rate(tmp_path: Path) -> None:
    config = parse_study(tomllib.loads(example_study_text()))  # TTFT draws only
    db = init_db(tmp_path / "g.db", config)
    simulate_virtual(db, config, SimParams(), 40, 4, 15, seed=3)
    g = study_glance(db)
    assert g.cycles == 2400 and g.participants == 40 and g.violations == 0
    rates = [b["rate"] for b in g.bands]
    assert rates[0] < 0.08 and rates[-1] > 0.25


def test_random_intercepts_shift_each_persons_switch_rate() -> None:
    config = wide_config(seed=4)
    base = simulate_virtual_frames(config, SimParams(truth="flat"), 80, 2, 40, seed=8)
    ri = simulate_virtual_frames(config, SimParams(truth="flat", switch_intercept_sd=1.0),
                                 80, 2, 40, seed=8)

    def people(frames: dict[str, pd.DataFrame]) -> list[dict]:
        gt = frames["ground_truth"]
        return [json.loads(v) for v in gt[gt["scope"] == "participant"]["params_json"]]

    b, r = people(base), people(ri)
    # Intercepts are drawn last: everything else about the people is unchanged per seed.
    assert [x["threshold_s"] for x in b] == [x["threshold_s"] for x in r]
    assert all(x["switch_offset"] == 0.0 for x in b)
    u = np.array([x["switch_offset"] for x in r])
    assert 0.75 < u.std() < 1.25
    rate = ri["cycle_truth"].groupby("participant_id", sort=False)["switched"].mean()
    expected = 1 / (1 + np.exp(-(_logit(0.15) + u)))
    assert np.corrcoef(rate.to_numpy(), expected)[0, 1] > 0.6
    flat_rate = base["cycle_truth"].groupby("participant_id")["switched"].mean()
    assert rate.std() > 1.5 * flat_rate.std()


def test_detection_share_is_the_share_of_switches_long_enough() -> None:
    from flowtrial.study.simulator.params import detection_share, expected_switch_probability

    params = SimParams(switch_intercept_sd=0.8)
    frames = simulate_virtual_frames(wide_config(seed=2), params, 100, 2, 30, seed=3)
    t = frames["cycle_truth"]
    away = t.loc[t["switched"], "time_away_s"]
    share = detection_share(params, 10.0)
    assert 0.85 < share < 0.95 and detection_share(params, 0) == 1.0
    assert abs((away >= 10).mean() - share) < 4 * math.sqrt(share * (1 - share) / len(away))
    # Population-averaged P(switch) integrates the intercepts too: the mean rate matches.
    expected = expected_switch_probability(t["idle_wait_s"].to_numpy(), params).mean()
    assert abs(t["switched"].mean() - expected) < 0.02
    no_ri = expected_switch_probability(t["idle_wait_s"].to_numpy(), SimParams()).mean()
    assert expected > no_ri  # a logit-normal intercept raises the mean of a low rate
