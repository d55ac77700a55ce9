"""The metrics layer on a hand-built database with known timings (time_scale = 2)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flowtrial.analysis.metrics import (
    cycle_table,
    cycle_table_from_frames,
    frames_from_tables,
    task_table,
)
from flowtrial.study.config import parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.schema import Cycle, Event, Persistence, Task
from flowtrial.study.storage import Database, WriteBatch, init_db, write_rows
from flowtrial.study.timeline import idle_wait_s

NS = 1_000_000_000
T0 = 1_763_700_000 * NS
SCALE = 2.0
NOW = datetime(2025, 11, 21, 12, 0, tzinfo=UTC)


def study_config(time_scale: float = SCALE, design: str = "parallel") -> object:
    return parse_study({
        "study": {"name": "metrics-test", "seed": 1, "design": design,
                  "time_scale": time_scale, "idle_limit_s": 600},
        "arms": [{"name": "fast", "ttft_ms": 200, "tokens_per_second": 1000},
                 {"name": "slow", "ttft_ms": 8000, "tokens_per_second": 50}],
        "capture": {"switch_min_away_s": 10, "working_apps": ["code", "terminal"]},
    })


def cyc(cid: str, pid: str, arm: str, mono: int, wall: int, r: float, first: float | None,
        last: float | None, **kw: object) -> dict:
    """A cycle with times in raw seconds after the process's monotonic anchor."""
    def t(x: float | None) -> int | None:
        return None if x is None else mono + int(round(x * NS))

    row = {"id": cid, "participant_id": pid, "arm": arm, "protocol": "chat", "period": 0,
           "mono_anchor_ns": mono, "wall_anchor_ns": wall, "t_request_ns": t(r),
           "t_first_sent_ns": t(first), "t_last_sent_ns": t(last),
           "t_done_ns": t(last), "started_at": NOW, "status": "ok", "violation": False}
    row.update(kw)
    return row


def event(pid: str, kind: str, wall_s: float, cycle_id: str | None = None,
          source: str = "client", **payload: object) -> dict:
    return {"participant_id": pid, "kind": kind, "ts_ns": T0 + int(round(wall_s * NS)),
            "cycle_id": cycle_id, "source": source, "received_at": NOW,
            "payload_json": json.dumps(payload) if payload else None}


def uniform(rows: list[dict]) -> list[dict]:
    """executemany needs the same keys in every row."""
    keys = {k for r in rows for k in r}
    return [{k: r.get(k) for k in keys} for r in rows]


def build(tmp_path: Path) -> Database:
    db = init_db(tmp_path / "study.db", study_config())
    cfg = study_config()
    enroll(db, cfg, "p1")
    enroll(db, cfg, "p2")
    # p1's process: monotonic anchor 5,000 s ↔ wall T0; p2's another process.
    m1, w1 = 5_000 * NS, T0
    m2, w2 = 9_000 * NS, T0 + 1_000 * NS
    cycles = [
        # c1: TTFT 0.5 raw, 11 tokens at 4 raw tokens/s (2.5 raw s), last at 3.0 raw.
        cyc("c1", "p1", "fast", m1, w1, 0, 0.5, 3.0, target_ttft_ms=400.0, target_tps=50.0,
            experienced_ttft_ms=500.0, achieved_tps=4.0, tokens_completion=11,
            violation=True, violation_ms=100.0),
        cyc("c2", "p1", "fast", m1, w1, 100, 100.2, 101.0, experienced_ttft_ms=200.0,
            achieved_tps=100.0, tokens_completion=81),
        cyc("c3", "p1", "fast", m1, w1, 500, 500.1, 500.5, experienced_ttft_ms=100.0,
            achieved_tps=None, tokens_completion=1),
        # p2: an upstream error (no content sent) and a normal cycle.
        cyc("c4", "p2", "slow", m2, w2, 0, None, None, status="upstream_error"),
        cyc("c5", "p2", "slow", m2, w2, 50, 54.0, 60.0, experienced_ttft_ms=None,
            achieved_tps=10.0, tokens_completion=None, tokens_sent=61),
    ]
    events = [
        # c1 wait is wall 0→3 raw s: away 1→10 raw (18 real s), back 7 raw after last sent.
        event("p1", "focus_out", 1.0, app="Firefox", category="browser"),
        event("p1", "focus_in", 10.0, app="code"),
        event("p1", "accept", 12.0, cycle_id="c1"),
        # c2 wait is 100→101 raw: a short hop (0.6 raw = 1.2 real s) and AFK 100.5→103.
        event("p1", "focus_out", 100.1, app="slack", category="chat"),
        event("p1", "focus_in", 100.7, app="code"),
        event("p1", "afk_start", 100.5, source="activitywatch"),
        event("p1", "afk_end", 103.0, source="activitywatch"),
        event("p1", "partial_accept", 104.0, cycle_id="c2", accepted_chars=10),
        # c3: two decisions, the first one counts
        event("p1", "reject", 501.0, cycle_id="c3"),
        event("p1", "accept", 502.0, cycle_id="c3"),
        # p2 (wall = T0 + 1000 s + raw): c5's last token at 1060 s
        event("p2", "accept", 1061.5, cycle_id="c5"),
    ]
    persistence = [
        {"cycle_id": "c1", "interval_s": 30.0, "score": 0.9, "persisted": True},
        {"cycle_id": "c1", "interval_s": 120.0, "score": 0.2, "persisted": False},
        {"cycle_id": "c2", "interval_s": 30.0, "score": 0.1, "persisted": False},
    ]
    tasks = [
        {"participant_id": "p1", "name": "t1", "period": 0, "arm": "fast",
         "forecast_fast_s": 1200.0, "forecast_slow_s": 1800.0, "status": "done",
         "started_at_ns": T0, "ended_at_ns": T0 + 1000 * NS, "created_at": NOW},
        {"participant_id": "p2", "name": "t2", "period": 0, "arm": None,
         "forecast_fast_s": 600.0, "forecast_slow_s": 900.0, "status": "done",
         "time_s": 300.0, "created_at": NOW},
    ]
    write_rows(db, [WriteBatch(Cycle, uniform(cycles)), WriteBatch(Event, uniform(events)),
                    WriteBatch(Persistence, persistence), WriteBatch(Task, uniform(tasks))])
    return db


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    return cycle_table(build(tmp_path_factory.mktemp("metrics"))).set_index("cycle_id")


def test_timings_are_converted_to_real_seconds(table: pd.DataFrame) -> None:
    c1 = table.loc["c1"]
    assert c1["total_wait_s"] == pytest.approx(6.0)
    assert c1["experienced_ttft_s"] == pytest.approx(1.0)
    assert c1["target_ttft_s"] == pytest.approx(0.8)
    assert c1["target_tps"] == pytest.approx(25.0)
    assert c1["achieved_tps"] == pytest.approx(2.0)
    assert c1["violation"] and c1["violation_s"] == pytest.approx(0.2)
    assert c1["idle_wait_s"] == pytest.approx(float(idle_wait_s(1.0, 11, 2.0)))
    assert c1["idle_wait_s"] == pytest.approx(1.0 + 11 / 2 - 11 / 5.3)
    assert c1["request_at"] == pd.Timestamp(T0, unit="ns", tz="UTC")
    assert c1["last_sent_at"] == pd.Timestamp(T0 + 3 * NS, unit="ns", tz="UTC")
    # c3: a one-token answer adds no delivery lag
    assert table.loc["c3", "idle_wait_s"] == pytest.approx(0.2)


def test_wall_anchor_of_each_process_is_used(table: pd.DataFrame) -> None:
    c5 = table.loc["c5"]
    assert int(c5["t_request_wall_ns"]) == T0 + 1050 * NS
    assert c5["experienced_ttft_s"] == pytest.approx(8.0)  # from t_first − t_request
    assert c5["total_wait_s"] == pytest.approx(20.0)
    assert c5["tokens_completion"] == 61  # tokens_sent when usage is missing
    assert c5["review_time_s"] == pytest.approx(3.0)


def test_switches_resumption_and_afk(table: pd.DataFrame) -> None:
    c1, c2 = table.loc["c1"], table.loc["c2"]
    assert c1["switched"] and c1["switched_10s"] and not c1["switched_30s"]
    assert c1["time_away_s"] == pytest.approx(18.0)
    assert c1["resumption_lag_s"] == pytest.approx(14.0)
    assert c1["switch_category"] == "browser"
    assert not c2["switched"] and not c2["switched_2s"]  # 1.2 real s, partly AFK
    assert c2["afk_overlap_s"] == pytest.approx(1.0)
    assert c2["resumption_lag_s"] == 0


def test_decisions_review_persistence(table: pd.DataFrame) -> None:
    assert list(table.loc[["c1", "c2", "c3", "c4", "c5"], "decision"]) == [
        "accept", "partial", "reject", "none", "accept"]
    assert table.loc["c1", "review_time_s"] == pytest.approx(18.0)
    assert table.loc["c2", "review_time_s"] == pytest.approx(6.0)
    assert np.isnan(table.loc["c4", "review_time_s"])
    assert table.loc["c1", "persisted_30s"] is True or bool(table.loc["c1", "persisted_30s"])
    assert not table.loc["c1", "persisted_120s"]
    assert pd.isna(table.loc["c3", "persisted_30s"])


def test_cycle_time_and_open_ended(table: pd.DataFrame) -> None:
    assert table.loc["c1", "cycle_time_s"] == pytest.approx(200.0)
    assert np.isnan(table.loc["c2", "cycle_time_s"]) and table.loc["c2", "open_ended"]
    assert np.isnan(table.loc["c3", "cycle_time_s"]) and not table.loc["c3", "open_ended"]
    assert table.loc["c4", "cycle_time_s"] == pytest.approx(100.0)


def test_error_cycle_has_no_wait(table: pd.DataFrame) -> None:
    c4 = table.loc["c4"]
    assert c4["status"] == "upstream_error"
    assert np.isnan(c4["total_wait_s"]) and np.isnan(c4["idle_wait_s"])
    assert not c4["switched"]


def test_documented_columns_present(table: pd.DataFrame) -> None:
    import flowtrial.analysis.metrics as m
    for col in ["participant_id", "arm", "period", "task_id", "protocol", "status",
                "started_at", "request_at", "first_sent_at", "last_sent_at", "target_ttft_s",
                "target_tps", "experienced_ttft_s", "total_wait_s", "idle_wait_s",
                "achieved_tps", "violation", "tokens_completion", "switched", "switched_2s",
                "switched_10s", "switched_30s", "switch_category", "time_away_s",
                "resumption_lag_s", "afk_overlap_s", "review_time_s", "decision",
                "cycle_time_s"]:
        assert col in table.columns
        documented = "switched_2s/10s/30s" if col.startswith("switched_") else col
        assert documented in m.__doc__


def test_task_table(tmp_path: Path) -> None:
    tasks = task_table(build(tmp_path)).set_index("name")
    assert tasks.loc["t1", "task_time_s"] == pytest.approx(2000.0)
    assert tasks.loc["t2", "task_time_s"] == pytest.approx(600.0)
    p2_arm = tasks.loc["t2", "arm"]
    assert p2_arm in ("fast", "slow")  # from p2's assignment
    assert tasks.loc["t1", "forecast_slow_s"] == 1800.0


def test_empty_database(tmp_path: Path) -> None:
    db = init_db(tmp_path / "empty.db", study_config())
    t = cycle_table(db)
    assert len(t) == 0 and "switched" in t.columns and "idle_wait_s" in t.columns
    assert len(task_table(db)) == 0


def test_100k_cycles_in_a_few_seconds() -> None:
    """Vectorized: 100,000 in-memory cycles with focus events go through in a few seconds
    (the database path is measured by benchmarks/bench_analyze.py)."""
    rng = np.random.default_rng(0)
    n_p, n_c = 100, 1000
    pid = np.repeat([f"p{p:03d}" for p in range(n_p)], n_c)
    r = np.cumsum(rng.uniform(20, 120, (n_p, n_c)), axis=1).ravel()
    wait = rng.lognormal(1.5, 1, n_p * n_c)
    r_ns = (r * NS).astype(np.int64)
    cycles = pd.DataFrame({
        "id": [f"c{i}" for i in range(n_p * n_c)], "participant_id": pid, "arm": "fast",
        "protocol": "chat", "status": "ok", "started_at": NOW, "mono_anchor_ns": 0,
        "wall_anchor_ns": T0, "t_request_ns": r_ns, "t_first_sent_ns": r_ns + NS // 2,
        "t_last_sent_ns": r_ns + (wait * NS).astype(np.int64), "target_ttft_ms": 500.0,
        "target_tps": 50.0, "experienced_ttft_ms": 500.0, "achieved_tps": 50.0,
        "violation": False, "tokens_completion": 300,
    })
    sw = rng.random(n_p * n_c) < 0.2
    t_out = r[sw] + rng.uniform(0, 1, sw.sum()) * wait[sw]
    t_in = t_out + rng.lognormal(3, 1, sw.sum())
    events = pd.DataFrame({
        "participant_id": np.r_[pid[sw], pid[sw]],
        "kind": ["focus_out"] * sw.sum() + ["focus_in"] * sw.sum(),
        "ts_ns": T0 + (np.r_[t_out, t_in] * NS).astype(np.int64),
        "source": "client", "cycle_id": None,
        "payload_json": ['{"app": "firefox"}'] * sw.sum() + ['{"app": "code"}'] * sw.sum(),
    })
    frames = frames_from_tables({"cycles": cycles, "events": events},
                                study_config(time_scale=1.0))
    t0 = time.perf_counter()
    t = cycle_table_from_frames(frames)
    elapsed = time.perf_counter() - t0
    assert len(t) == n_p * n_c
    # Switches last lognormal(3, 1) s: P(>= 10 s) ≈ 0.87, so ≈ 17 % of cycles.
    assert 0.12 < t["switched"].mean() < 0.2
    assert elapsed < 8.0, f"cycle_table took {elapsed:.1f} s"


@pytest.mark.parametrize("time_scale", [1.0, 10.0])
def test_metrics_recover_simulator_truth(time_scale: float) -> None:
    """On a virtual study, the measured switches are exactly the simulator's switches of at
    least 10 s, with their time away, and the experienced TTFT is the simulated one."""
    import tomllib

    from flowtrial.study.config import example_study_text
    from flowtrial.study.simulator import SimParams, simulate_virtual_frames

    data = tomllib.loads(example_study_text())
    data["study"]["time_scale"] = time_scale
    data["per_prompt"]["tokens_per_second"] = {"min": 3, "max": 2000, "scale": "log"}
    cfg = parse_study(data)
    tables = simulate_virtual_frames(cfg, SimParams(), 12, tasks=2, prompts_per_task=20, seed=4)
    t = cycle_table_from_frames(frames_from_tables(tables, cfg)).set_index("cycle_id")
    truth = tables["cycle_truth"].set_index("cycle_id").loc[t.index]
    expected = truth["switched"].to_numpy() & (truth["time_away_s"].fillna(0) >= 10).to_numpy()
    assert expected.sum() > 10
    assert (t["switched"].to_numpy() == expected).all()
    sw = t["switched"].to_numpy()
    np.testing.assert_allclose(t["time_away_s"].to_numpy()[sw],
                               truth["time_away_s"].to_numpy()[sw], atol=1e-6)
    np.testing.assert_allclose(t["experienced_ttft_s"], truth["ttft_s"], rtol=1e-9)
    assert (t["decision"] != "none").all() and t["review_time_s"].gt(0).all()
    # The idle wait uses the study's [analysis] reading_tps: a slower reader idles less.
    data["analysis"] = {"reading_tps": 3.0}
    slow = cycle_table_from_frames(frames_from_tables(tables, parse_study(data)))
    slow = slow.set_index("cycle_id").loc[t.index]
    expect = idle_wait_s(t["experienced_ttft_s"], t["tokens_completion"].astype(float),
                         t["achieved_tps"], 3.0)
    np.testing.assert_allclose(slow["idle_wait_s"], expect, rtol=1e-9)
    assert (slow["idle_wait_s"] <= t["idle_wait_s"] + 1e-12).all()
    assert (slow["idle_wait_s"] < t["idle_wait_s"] - 1e-6).any()
