"""The post-review secondary analysis (METR's outcome) on a simulated parallel study whose
participants recorded, after review, how long they still worked and how each task ended."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sqlalchemy import text

from flowtrial.analysis.metrics import read_frames, task_table_from_frames
from flowtrial.analysis.task_outcomes import post_review_section
from flowtrial.study.storage import open_db
from tests.analysis.test_report import make_study


def test_post_review_effect_and_outcomes(tmp_path: Path) -> None:
    db = open_db(make_study(tmp_path / "par.db", design="parallel", n=10, prompts=5,
                            time_scale=1.0))
    tasks = task_table_from_frames(read_frames(db))
    assert "skipped" in post_review_section(db.config(), tasks, 300.0)  # none recorded yet
    rng = np.random.default_rng(3)
    with db.engine.begin() as conn:
        for tid, arm in conn.execute(text("SELECT id, arm FROM tasks")).all():
            # The slow arm needs much longer after review, and fails review more often.
            slow = arm == "slow"
            minutes = float(rng.uniform(60, 90) if slow else rng.uniform(5, 10))
            outcome = "failed_review" if slow and tid % 3 == 0 else "done"
            conn.execute(text("UPDATE tasks SET post_review_s = :s, outcome = :o WHERE id = "
                              ":i"), {"s": minutes * 60, "o": outcome, "i": tid})
    tasks = task_table_from_frames(read_frames(db))
    assert tasks["post_review_s"].notna().all() and set(tasks["outcome"]) <= {
        "done", "failed_review"}
    sec = post_review_section(db.config(), tasks, 300.0)
    eff = sec["effect"]
    assert eff["treatment_arm"] == "fast" and eff["n"] == 40
    assert eff["estimate"] < 0  # the fast arm's total time is shorter
    by_arm = {r["arm"]: r for r in sec["by_arm"]}
    assert by_arm["fast"]["failed_review"] == 0 and by_arm["slow"]["failed_review"] > 0
    assert by_arm["fast"]["done"] + by_arm["slow"]["done"] + by_arm["slow"][
        "failed_review"] == 40
    assert by_arm["slow"]["median_total_time_s"] > by_arm["fast"]["median_total_time_s"]
    db.dispose()
