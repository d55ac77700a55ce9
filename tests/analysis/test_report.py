"""`flowtrial analyze` (analysis.report) on small virtual studies and edge cases."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.analysis.report import run_analysis
from flowtrial.analysis.report_commands import analyze
from flowtrial.study.config import example_study_text, parse_study
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.storage import init_db

THRESHOLD_KEYS = {"psi_s", "ci_s", "p_exists", "model_choice"}


def config_for(design: str = "per_prompt", time_scale: float = 10.0):  # noqa: ANN201
    data = tomllib.loads(example_study_text(design))  # type: ignore[arg-type]
    data["study"]["time_scale"] = time_scale
    data["study"]["name"] = f"report-test-{design}"
    if design != "per_prompt":
        data["study"]["design"] = design
        data["study"]["unit"] = "participant" if design == "parallel" else "task"
    return parse_study(data)


def make_study(path: Path, design: str = "per_prompt", n: int = 12, prompts: int = 15,
               time_scale: float = 10.0, seed: int = 3) -> Path:
    cfg = config_for(design, time_scale)
    db = init_db(path, cfg)
    simulate_virtual(db, cfg, SimParams(), n, tasks=4, prompts_per_task=prompts, seed=seed)
    db.dispose()
    return path


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(analyze)
    return app


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study(tmp_path_factory.mktemp("pp") / "study.db")


@pytest.fixture(scope="module")
def per_prompt(study_db: Path) -> tuple[dict, Path]:
    out = study_db.parent / "report"
    results = run_analysis(study_db, out, n_boot=20, seed=0, workers=1)
    return results, out


def test_results_json_has_every_section(per_prompt: tuple[dict, Path]) -> None:
    results, out = per_prompt
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["threshold"]["psi_s"] == results["threshold"]["psi_s"]
    for key in ("study", "checks", "task_effect", "threshold", "threshold_sensitivity",
                "secondary", "ground_truth", "figures", "wait_measure"):
        assert key in on_disk, key
    assert THRESHOLD_KEYS <= set(on_disk["threshold"])
    assert on_disk["wait_measure"] == "idle_wait_s"
    assert {r["wait_measure"] for r in on_disk["threshold_sensitivity"]} >= {
        "total_wait_s", "experienced_ttft_s", "idle_wait_at_3.71tps_s", "idle_wait_at_7.42tps_s"}
    assert on_disk["study"]["reading_tps"] == 5.3
    # Provenance: the flowtrial version and the study configuration's hash, in the report too.
    from flowtrial.study.storage import open_db

    db = open_db(out.parent / "study.db")
    assert on_disk["study"]["config_hash"] == db.config().config_hash()
    db.dispose()
    assert on_disk["study"]["flowtrial_version"]
    html = (out / "report.html").read_text()
    assert on_disk["study"]["config_hash"] in html
    # The post-review secondary row: outcomes per arm, the effect skipped (per-prompt).
    assert "skipped" in on_disk["task_post_review"] and 'id="post-review"' in html
    assert on_disk["checks"]["manipulation"]
    # per-prompt design: no arms, so no task-time effect, and it says why
    assert "skipped" in on_disk["task_effect"]
    sec = on_disk["secondary"]
    assert sec["by_arm"] and sec["by_wait_band"]
    assert 0 <= sec["by_arm"][0]["acceptance_rate"] <= 1
    assert sec["by_arm"][0]["cycles_per_hour"] > 0


def test_ground_truth_is_compared(per_prompt: tuple[dict, Path]) -> None:
    results, _ = per_prompt
    gt = results["ground_truth"]
    assert gt["truth_model"] == "hinge" and gt["threshold_s"] == 8.0
    cmp = gt["comparison"]
    personal = results["threshold"]["personal"]
    assert cmp["true_psi_s"] == 8.0 and cmp["estimated_psi_s"] == personal["median_psi_s"]
    assert cmp["true_tau"] == 0.35 and cmp["estimated_tau"] == personal["tau"]
    assert cmp["pooled_psi_s"] == results["threshold"]["psi_s"]
    # The detection share is estimated from the most inclusive switch rule (2 s) ...
    assert personal["detection_share_source"] == "switched_2s"
    assert 0.8 < personal["detection_share"] <= 1.0
    # ... and ψ* is scored on counted switches, so it lies below the median person's ψ.
    assert cmp["estimand_psi_s"] < 8.0
    assert len(gt["participant_threshold_s"]) == 12


def test_html_report_embeds_figures_and_time_scale_note(per_prompt: tuple[dict, Path]) -> None:
    results, out = per_prompt
    html = (out / "report.html").read_text()
    assert set(results["figures"]) == {"switch_vs_wait", "wait_distributions", "manipulation",
                                       "participants"}
    assert html.count('src="data:image/png;base64,') == 4
    assert "time_scale = 10" in html and "converted back" in html
    assert "Ground truth" in html and "true ψ" in html
    assert "median personal threshold" in html and "reading speed 5.3 tokens/s" in html
    assert "Bonferroni" in html  # the sensitivity rows' multiplicity note
    assert results["study"]["time_compressed"] is True
    assert results["study"]["time_scale"] == 10.0


def test_parallel_study_estimates_task_effect(tmp_path: Path) -> None:
    from flowtrial.analysis.metrics import read_frames, task_table_from_frames
    from flowtrial.analysis.report import checks_section, task_effect_section
    from flowtrial.study.storage import open_db

    db = open_db(make_study(tmp_path / "par.db", design="parallel", n=10, prompts=5,
                            time_scale=1.0))
    frames = read_frames(db)
    tasks = task_table_from_frames(frames)
    e = task_effect_section(db.config(), tasks, 300.0)
    assert e["treatment_arm"] == "fast" and e["control_arm"] == "slow"
    assert e["forecast"] == "forecast_slow_s"
    assert e["n"] == 40 and -1 < e["estimate"] < 5
    assert e["ci"]["cluster"][0] < e["estimate"] < e["ci"]["cluster"][1]
    from flowtrial.analysis.metrics import cycle_table_from_frames

    checks = checks_section(db.config(), frames, cycle_table_from_frames(frames), tasks)
    assert checks["srm"]["observed"] == {"fast": 5, "slow": 5}
    assert "skipped" in checks["carryover"]  # parallel: no periods


def test_cli_json_output(study_db: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli(), ["--db", str(study_db), "--out", str(tmp_path / "rep"),
                                     "--json", "--n-boot", "10"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert THRESHOLD_KEYS <= set(data["threshold"])
    assert data["threshold"]["n_boot"] == 10
    assert (tmp_path / "rep" / "report.html").exists()
    assert json.loads((tmp_path / "rep" / "results.json").read_text())["study"] == data["study"]


def test_cli_summary_output(study_db: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli(), ["--db", str(study_db), "--out", str(tmp_path / "rep"),
                                     "--n-boot", "10"])
    assert res.exit_code == 0, res.output
    assert "report.html" in res.stdout and "Ground truth" in res.stdout


def test_empty_database_is_a_clear_error(tmp_path: Path) -> None:
    db = init_db(tmp_path / "empty.db", config_for())
    db.dispose()
    res = CliRunner().invoke(cli(), ["--db", str(tmp_path / "empty.db"),
                                     "--out", str(tmp_path / "rep")])
    assert res.exit_code == 2
    assert "no cycles" in res.stderr and "Traceback" not in res.output
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("error:")] == [
        res.stderr.strip().splitlines()[-1]]
    missing = CliRunner().invoke(cli(), ["--db", str(tmp_path / "nope.db")])
    assert missing.exit_code == 2 and "no such database" in missing.stderr
    bad = CliRunner().invoke(cli(), ["--db", str(tmp_path / "empty.db"), "--n-boot", "3"])
    assert bad.exit_code == 2 and "--n-boot" in bad.stderr


def test_tiny_study_gets_a_report_with_reasons(tmp_path: Path) -> None:
    db = make_study(tmp_path / "tiny.db", n=1, prompts=1)  # 4 cycles, one participant
    r = run_analysis(db, tmp_path / "rep", n_boot=10, workers=1)
    assert r["threshold"]["psi_s"] is None and not r["threshold"]["found"]
    assert "Threshold not estimated" in r["threshold"]["reason"]
    assert any("too few" in m for m in r["messages"])
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.split("<details>")[0].count("No flow threshold") == 1  # results.json has it too


def test_worker_processes_give_the_same_results(study_db: Path) -> None:
    one = run_analysis(study_db, None, n_boot=10, workers=1)
    two = run_analysis(study_db, None, n_boot=10, workers=2)
    assert one["threshold"] == two["threshold"]
    assert one["threshold_sensitivity"] == two["threshold_sensitivity"]
