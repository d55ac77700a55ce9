"""Matched latency: a matched arm draws the matched arm's recorded TTFT and tokens/s."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

from flowtrial.instrumentation.proxy.arms import ArmResolver
from flowtrial.instrumentation.proxy.matched import MatchedLatency
from flowtrial.study.config import parse_study, speed_vs_capability_text
from flowtrial.study.participants import assignments_for, enroll
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.simulator.capability import SimModel
from flowtrial.study.storage import init_db

# Speeds come from the template's simulated upstreams (codex: 2.5 s raw TTFT).
MODELS = {"gpt-5.3-codex-spark": SimModel(success=0.5), "gpt-5.3-codex": SimModel(success=0.8)}


def _config(design: str = "crossover", time_scale: float = 10.0):  # noqa: ANN202
    data = tomllib.loads(speed_vs_capability_text())
    data["study"]["time_scale"] = time_scale
    if design == "parallel":
        data["study"].update(design="parallel", unit="participant")
        data["study"].pop("periods")
    return parse_study(data)


def test_prior_until_enough_then_recorded_draws(tmp_path: Path) -> None:
    cfg = _config()
    db = init_db(tmp_path / "m.db", cfg)
    matched = MatchedLatency(cfg, db.engine, refresh_s=0.0, seed=1)
    first = matched.draw("spark-slowed")
    info = json.loads(first.draw_json)
    # Before codex has any cycles: the stated prior, compressed by time_scale.
    assert info["source"] == "prior" and info["recorded"] == 0
    assert first.target.ttft_ms == 2500 / 10 and first.target.tokens_per_second == 75 * 10
    simulate_virtual(db, cfg, SimParams(models=MODELS), 12, tasks=6, prompts_per_task=6, seed=2)
    matched.refresh()
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT experienced_ttft_ms, achieved_tps FROM cycles WHERE arm = 'codex'").all()
    recorded = {(round(t, 6), round(v, 6)) for t, v in rows}
    assert len(rows) >= 30  # enough for matched_after = 30
    draws = [matched.draw("spark-slowed") for _ in range(50)]
    assert all(json.loads(d.draw_json)["source"] == "recorded" for d in draws)
    # Every draw is one of codex's recorded (raw) pairs; they vary, as the recorded ones do.
    pairs = {(round(d.target.ttft_ms, 6), round(d.target.tokens_per_second, 6)) for d in draws}
    assert pairs <= recorded and len(pairs) > 5
    real = json.loads(draws[0].draw_json)
    # Real units in the record: codex's 2.5 s raw TTFT at time_scale 10.
    assert abs(real["ttft_ms"] - 2500 * 10) < 300


def test_resolver_gives_matched_arm_a_recorded_draw(tmp_path: Path) -> None:
    cfg = _config("parallel")
    db = init_db(tmp_path / "p.db", cfg)
    for i in range(1, 7):
        enroll(db, cfg, f"p{i:02d}")
    pid = next(f"p{i:02d}" for i in range(1, 7)
               if assignments_for(db, f"p{i:02d}")[0] == "spark-slowed")
    resolver = ArmResolver(db, cfg)

    async def go() -> list:  # noqa: ANN401
        out = [await resolver.resolve(pid) for _ in range(3)]
        await asyncio.sleep(0.2)  # the first draw started a refresh in a worker thread
        return out

    try:
        res = asyncio.run(go())
    finally:
        resolver.close()
    assert {r.arm for r in res} == {"spark-slowed"}
    assert all(json.loads(r.draw_json)["matched_to"] == "codex" for r in res)
    assert res[0].target is not None and res[0].target.shaped
