"""Power analysis by simulation (analysis.power) on tiny grids."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from flowtrial.analysis.power import (
    GRID_COLUMNS,
    _seed,
    design_tasks,
    power_grid,
    power_replicates,
    summarize,
)
from flowtrial.analysis.report_commands import power
from flowtrial.study.config import example_study_text, parse_study


def config_for(design: str = "per_prompt"):  # noqa: ANN201
    data = tomllib.loads(example_study_text(design))  # type: ignore[arg-type]
    if design != "per_prompt":
        data["study"]["design"] = design
        data["study"]["unit"] = "participant" if design == "parallel" else "task"
    return parse_study(data)


def test_tiny_grid_per_prompt() -> None:
    progress: list[tuple[int, int]] = []
    grid = power_grid(config_for(), [3, 4], [20], sims=1, n_boot=10, workers=1,
                      progress=lambda d, t: progress.append((d, t)))
    assert list(grid.columns) == GRID_COLUMNS
    assert list(grid["participants"]) == [3, 4] and (grid["sims"] == 1).all()
    assert grid["power_threshold"].between(0, 1).all()
    assert (grid["power_threshold_ci_lo"] <= grid["power_threshold"]).all()
    assert grid["ci_coverage"].notna().all()  # hinge truth: coverage is defined
    assert grid["power_effect"].isna().all()  # per-prompt: no arms, no task-time effect
    assert progress == [(1, 2), (2, 2)]


def test_replicates_are_seeded_and_independent_of_workers() -> None:
    cfg = config_for()
    a = power_replicates(cfg, [3], [20], sims=2, n_boot=10, seed=5, workers=1)
    b = power_replicates(cfg, [3], [20], sims=2, n_boot=10, seed=5, workers=2)
    cols = ["seed", "psi_s", "found", "ci_lo", "ci_hi"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert a["seed"].nunique() == 2  # replicates differ
    assert _seed(6, 3, 20, 0) != a["seed"].iloc[0] == _seed(5, 3, 20, 0)


def test_parallel_design_reports_effect_power() -> None:
    cfg = config_for("parallel")
    assert design_tasks(cfg, 20) == (4, 5)
    grid = power_grid(cfg, [6], [8], sims=1, n_boot=10, truth="flat", workers=1)
    row = grid.iloc[0]
    assert 0 <= row["power_effect"] <= 1 and np.isfinite(row["mean_effect"])
    assert row["ci_coverage"] is None or np.isnan(row["ci_coverage"])  # flat: no true ψ


def test_summarize_counts_coverage() -> None:
    reps = pd.DataFrame({
        "participants": 10, "prompts": 30, "rep": [0, 1, 2, 3],
        "fit_ok": [True, True, True, False], "found": [True, False, True, False],
        "psi_s": [7.0, 9.0, 20.0, None], "ci_lo": [5.0, 6.0, 15.0, None],
        "ci_hi": [9.0, 12.0, 30.0, None], "effect_ok": False, "effect": None,
        "effect_p": None, "seconds": 1.0, "psi_star": [6.0, 6.5, 6.2, None],
        "prompts_simulated": 32,
    })
    row = summarize(reps, "hinge", 8.0).iloc[0]
    assert row["power_threshold"] == 0.5
    # Coverage is scored against each replicate's estimand ψ*, the median ψ alongside.
    assert row["ci_coverage"] == pytest.approx(2 / 3)
    assert row["ci_coverage_median_psi"] == pytest.approx(2 / 3)
    assert row["psi_star_s"] == pytest.approx(6.2)
    reps["psi_star"] = [5.5, 6.5, 16.0, None]
    row = summarize(reps, "hinge", 8.0).iloc[0]
    assert row["ci_coverage"] == pytest.approx(1.0)  # rep 2 now covers its ψ*
    assert row["ci_coverage_median_psi"] == pytest.approx(2 / 3)
    assert row["fit_failures"] == 1 and row["median_psi_s"] == 9.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="truth"):
        power_grid(config_for(), [3], [10], sims=1, truth="sideways")
    with pytest.raises(ValueError, match="participants"):
        power_grid(config_for(), [0], [10], sims=1)


def test_cli_power_writes_csv_and_table(tmp_path: Path) -> None:
    study = tmp_path / "study.toml"
    study.write_text(example_study_text())
    app = typer.Typer()
    app.command()(power)
    out = tmp_path / "power.csv"
    res = CliRunner().invoke(app, ["--study", str(study), "--participants", "3",
                                   "--prompts", "15", "--sims", "1", "--n-boot", "10",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    grid = pd.read_csv(out)
    assert list(grid.columns) == GRID_COLUMNS and len(grid) == 1
    assert "Power (hinge truth, ψ = 8 s" in res.stdout and "Wrote" in res.stdout
    bad = CliRunner().invoke(app, ["--study", str(study), "--participants", "ten"])
    assert bad.exit_code == 2 and "--participants" in bad.stderr
    missing = CliRunner().invoke(app, ["--study", str(tmp_path / "none.toml")])
    assert missing.exit_code == 2 and "not found" in missing.stderr


def test_effect_power_counts_only_the_true_direction_and_simulated_prompts() -> None:
    reps = pd.DataFrame({
        "participants": 10, "prompts": 10, "prompts_simulated": 12, "rep": [0, 1, 2, 3],
        "fit_ok": False, "found": False, "psi_s": None, "ci_lo": None, "ci_hi": None,
        "psi_star": None, "seconds": 1.0, "effect_ok": True,
        "effect": [-0.2, 0.3, -0.1, -0.05], "effect_p": [0.01, 0.01, 0.2, 0.04],
    })
    row = summarize(reps, "flat", 8.0).iloc[0]
    assert row["power_effect"] == 0.5  # a significant slowdown is not power
    assert row["effect_wrong_direction"] == 0.25
    assert row["prompts_simulated"] == 12 and row["prompts"] == 10
    cfg = config_for("parallel")
    assert design_tasks(cfg, 10) == (4, 2)  # 10 asked, 8 simulated: the grid must say so
