"""Task-time effects with more than two arms: every arm against the slowest, and a trend."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from flowtrial.analysis.report import task_effect_section

# Three arms with known effects on task time against the slowest: −30 %, −15 %, 0.
EFFECTS = {"fast": -0.30, "mid": -0.15, "slow": 0.0}


def _config() -> SimpleNamespace:
    arms = [SimpleNamespace(name="fast", ttft_ms=200, tokens_per_second=1000.0),
            SimpleNamespace(name="mid", ttft_ms=1000, tokens_per_second=150.0),
            SimpleNamespace(name="slow", ttft_ms=2000, tokens_per_second=50.0)]
    return SimpleNamespace(study=SimpleNamespace(design="crossover"), arms=arms)


def _tasks(seed: int, n_people: int = 30, per_arm: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_people):
        person = rng.normal(0, 0.3)
        for arm, eff in EFFECTS.items():
            for _ in range(per_arm):
                forecast = float(np.exp(rng.normal(np.log(1800), 0.5)))
                t = np.exp(np.log(forecast) + person + np.log1p(eff) + rng.normal(0, 0.35))
                rows.append({"participant_id": f"p{p:02d}", "arm": arm, "task_time_s": t,
                             "forecast_slow_s": forecast})
    return pd.DataFrame(rows)


def test_every_arm_against_the_slowest_and_a_trend() -> None:
    tasks = _tasks(seed=1)
    e = task_effect_section(_config(), tasks, 300.0)
    assert (e["treatment_arm"], e["control_arm"]) == ("fast", "slow")
    # The headline keeps every task: the middle arm is in the model, not left out.
    assert e["n"] == len(tasks)
    rows = {r["arm"]: r for r in e["by_arm"]["rows"]}
    assert e["by_arm"]["reference_arm"] == "slow" and set(rows) == {"fast", "mid"}
    for arm in rows:
        lo, hi = rows[arm]["ci"]
        assert lo < EFFECTS[arm] < hi, (arm, rows[arm])
    assert rows["fast"]["estimate"] == e["estimate"]  # the same coefficient, one model
    assert rows["fast"]["expected_wait_s"] < rows["mid"]["expected_wait_s"]
    # Longer waits, longer tasks: a positive change per doubling of the wait.
    trend = e["by_arm"]["trend"]
    assert trend["n"] == len(tasks) and trend["ci"][0] > 0
    assert 0 < trend["cr2_df"] <= 29


def test_two_arms_have_no_arm_rows() -> None:
    tasks = _tasks(seed=2)
    two = tasks[tasks["arm"] != "mid"]
    e = task_effect_section(_config(), two, 300.0)
    assert e["by_arm"] is None and e["note"] is None and e["n"] == len(two)


def test_three_arm_crossover_report_shows_every_arm(tmp_path) -> None:  # noqa: ANN001
    import tomllib

    from flowtrial.analysis.report import run_analysis
    from flowtrial.study.config import example_study_text, parse_study
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db

    data = tomllib.loads(example_study_text("crossover"))
    data["study"].update(design="crossover", unit="task", name="three-arms", time_scale=10.0)
    data["arms"].insert(1, {"name": "middle", "ttft_ms": 2000, "tokens_per_second": 150})
    cfg = parse_study(data)
    db = init_db(tmp_path / "three.db", cfg)
    simulate_virtual(db, cfg, SimParams(), 9, tasks=6, prompts_per_task=3, seed=4)
    db.dispose()
    results = run_analysis(tmp_path / "three.db", tmp_path / "out", n_boot=10, seed=0,
                           workers=1, figures=False)
    e = results["task_effect"]
    assert len(e["by_arm"]["rows"]) == 2 and e["n"] == 54
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Every arm against the slowest" in html and "per doubling of the wait" in html
