"""CLI functions `flowtrial.analysis.commands.effect` / `threshold`, on a tiny typer app."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from flowtrial.analysis.commands import effect, threshold
from flowtrial.analysis.effects import estimate_effect
from flowtrial.analysis.threshold_truth import simulate_switch_data
from tests.analysis.test_effects import TIME, make_metr_like

app = typer.Typer()
app.command("effect")(effect)
app.command("threshold")(threshold)
runner = CliRunner()


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "issues.csv"
    make_metr_like().to_csv(path, index=False)
    return path


ARGS = [
    "--time",
    TIME,
    "--treatment",
    "ai_treatment",
    "--forecast",
    "predicted_time_no_ai",
    "--cluster",
    "dev_id",
    "--impute",
    "arm_mean",
]


def test_effect_json(csv: Path) -> None:
    res = runner.invoke(app, ["effect", str(csv), *ARGS, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data)[:3] == ["estimate", "ci", "n"]
    assert list(data["ci"]) == ["cluster_cr2", "nonrobust", "hc3", "cluster"]
    assert data["default_se"] == "cluster_cr2" and "too small" in data["imputation_note"]
    ref = estimate_effect(
        pd.read_csv(csv), TIME, "ai_treatment", "predicted_time_no_ai", "dev_id", impute="arm_mean"
    )
    assert data["estimate"] == pytest.approx(ref.estimate)
    assert data["ci"]["hc3"] == pytest.approx(ref.ci["hc3"])
    assert data["n"] == ref.n


def test_effect_table(csv: Path) -> None:
    res = runner.invoke(app, ["effect", str(csv), *ARGS])
    assert res.exit_code == 0, res.output
    for label in ("non-robust", "HC3", "clustered", "mixed"):
        assert label in res.stdout


@pytest.mark.parametrize(
    "extra",
    [
        ["--treatment", "nope"],
        ["--impute", "median"],
        [
            "--forecast",
            "initial_implementation_time",
            "--time",
            "issue_id+dev_id",
            "--treatment",
            "dev_id",
        ],
    ],
)
def test_effect_bad_input_exits_2_with_one_line(csv: Path, extra: list[str]) -> None:
    res = runner.invoke(app, ["effect", str(csv), *ARGS, *extra])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
    assert res.stdout == ""


def test_effect_missing_file_exits_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["effect", str(tmp_path / "none.csv"), *ARGS])
    assert res.exit_code == 2 and "no such file" in res.stderr


def test_threshold_command(tmp_path: Path) -> None:
    path = tmp_path / "cycles.csv"
    df = simulate_switch_data("hinge", 30, 80, psi_sd=0.0, seed=1)
    # Answer lengths: what the model speeds mean is computed from the study's own answers.
    df["tokens_completion"] = np.random.default_rng(0).integers(50, 1500, len(df))
    df.rename(columns={"wait_s": "idle_wait_s"}).to_csv(path, index=False)
    res = runner.invoke(
        app,
        [
            "threshold",
            str(path),
            "--wait",
            "idle_wait_s",
            "--n-boot",
            "20",
            "--n-null",
            "20",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    pers, pooled = data["personal"], data["pooled"]
    assert pers["ci_s"][0] <= pers["median_psi_s"] <= pers["ci_s"][1]
    assert pers["ci_s"][0] <= 8.0 <= pers["ci_s"][1]
    assert pooled["ci_s"][0] <= pooled["psi_s"] <= pooled["ci_s"][1]
    # Found, so the quadrature check (run beside the test) entered the verdict.
    assert pers["node_check"]["nodes"] in ([20, 7], [16, 7, 7])  # finer adaptive nodes
    assert pers["quadrature"] == "adaptive"  # the default
    # 2,400 cycles: the gradual onsets are not alternatives by default
    assert not {"rounded", "scurve"} & set(data["alternatives"]["loglik"])
    assert data["found"] and "tokens_per_second_at_median_length" not in data
    speed = data["speed_table"]
    assert speed["n_answers"] == len(df) and speed["psi_s"] == pers["median_psi_s"]
    assert [(r["tokens_per_second"], r["ttft_s"]) for r in speed["rows"]] == [
        (v, t) for v in (50, 75, 150, 1000, 3000) for t in (0.5, 2.0)]
    # Every pace here outruns a 5.3 tokens/s reader: only a TTFT could idle past ψ (~8 s).
    assert all(r["share"] == 0.0 and r["share_range"][0] == 0.0 for r in speed["rows"])
    assert all(0.0 <= r["share_range"][1] <= 1.0 for r in speed["rows"])
    text = runner.invoke(app, ["threshold", str(path), "--wait", "idle_wait_s", "--n-boot", "20",
                               "--n-null", "20", "--workers", "1", "--no-gradual-onsets"])
    assert text.exit_code == 0 and "Median personal threshold" in text.stdout
    assert "Pooled onset ψ*" in text.stdout
    assert "at 3000 tokens/s, TTFT 2 s:" in text.stdout  # the table, for a found threshold
    share = runner.invoke(app, ["threshold", str(path), "--wait", "idle_wait_s",
                                "--detection-share", "1.5"])
    assert share.exit_code == 2 and "--detection-share" in share.stderr
    quad = runner.invoke(app, ["threshold", str(path), "--wait", "idle_wait_s",
                               "--quadrature", "laplace"])
    assert quad.exit_code == 2 and "--quadrature laplace" in quad.stderr
    assert "Traceback" not in quad.output
    bad = runner.invoke(app, ["threshold", str(path)])
    assert bad.exit_code == 2 and "wait_s" in bad.stderr


def test_threshold_command_bounds_only_a_threshold_it_finds(tmp_path: Path) -> None:
    """Memoryless switching: no threshold, so no CI of one (the slowest refits skipped) —
    said in words, None in JSON; ``--all-intervals`` computes them anyway."""
    path = tmp_path / "cycles.csv"
    df = simulate_switch_data("hazard", 20, 50, seed=5, intercept_sd=0.5)
    df["tokens_completion"] = 400
    df.to_csv(path, index=False)
    base = ["threshold", str(path), "--n-boot", "20", "--n-null", "20", "--workers", "1"]
    text = runner.invoke(app, base)
    assert text.exit_code == 0, text.output
    words = " ".join(text.stdout.split())  # rich wraps long lines
    assert "(95 % CI not computed: no threshold to bound)" in words
    assert "No threshold:" in words
    plain = json.loads(runner.invoke(app, [*base, "--json"]).stdout)
    assert not plain["found"] and plain["personal"]["ci_s"] is None
    assert plain["personal"]["tau_ci"] is None
    full = json.loads(runner.invoke(app, [*base, "--json", "--all-intervals"]).stdout)
    ci = full["personal"]["ci_s"]
    assert not full["found"] and ci[0] < full["personal"]["median_psi_s"] < ci[1]
    assert full["reason"] == plain["reason"]
    # A threshold the verdict does not report means nothing in tokens/s, even with its CI.
    assert full["speed_table"]["rows"] is None and full["speed_table"]["reason"] == "no threshold"
    assert "tokens/s" not in words
