"""Speed versus capability end to end on a simulated study: report, console, dashboard."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.config import parse_study, speed_vs_capability_text

MODELS = ["--model", "gpt-5.3-codex-spark=300:1000:0.4", "--model", "gpt-5.3-codex=12000:40:0.8"]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sc")
    runner = CliRunner()
    r = runner.invoke(app, ["init", str(d / "study.toml"), "--template", "speed-vs-capability"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["simulate", "--study", str(d / "study.toml"), "--db",
                            str(d / "sc.db"), "--participants", "18", "--tasks", "6",
                            "--prompts-per-task", "10", "--seed", "2", *MODELS])
    assert r.exit_code == 0, r.output
    return d


def test_report_separates_speed_and_capability(study: Path) -> None:
    r = CliRunner().invoke(app, ["analyze", "--db", str(study / "sc.db"), "--out",
                                 str(study / "report"), "--n-boot", "10"])
    assert r.exit_code == 0, r.output
    assert "Task time, capability (codex vs spark-slowed)" in r.output
    sc = json.loads((study / "report" / "results.json").read_text())["speed_capability"]
    rows = {c["contrast"]: c for c in sc["contrasts"]}
    assert set(rows) == {"speed", "capability", "naive"}
    # The simulated truth sits beside each estimate; a 2:1 capability gap is found.
    assert all("true_effect" in c and "covers_truth" in c for c in rows.values())
    cap = rows["capability"]
    assert cap["true_effect"] < -0.3 and cap["ci"][1] < 0
    # Outcomes per arm: the weaker model needs more attempts and is accepted less often.
    out = {o["arm"]: o for o in sc["outcomes"]}
    assert out["spark"]["attempts_per_task"] > out["codex"]["attempts_per_task"]
    assert out["spark"]["acceptance_rate"] < out["codex"]["acceptance_rate"]
    # Chat attempts: one model call and no tool step per turn.
    assert all(o["calls_per_turn"] == 1 and o["tool_steps_per_turn"] == 0
               for o in out.values())
    # The matched arm delivered codex's latency; every arm served its own model.
    (m,) = sc["matched_latency"]
    assert m["ok"] and abs(m["ttft_ratio"] - 1) < 0.05
    assert all(s["ok"] for s in sc["served_models"]) and len(sc["served_models"]) == 3
    html = (study / "report" / "report.html").read_text()
    assert "Speed versus capability" in html and "same model, different speed" in html


def test_validate_explains_each_contrast(study: Path) -> None:
    r = CliRunner().invoke(app, ["validate", "--study", str(study / "study.toml")])
    assert r.exit_code == 0, r.output
    for name in ("contrast speed: spark vs spark-slowed", "contrast capability: codex vs "
                 "spark-slowed", "contrast naive: spark vs codex"):
        assert name in " ".join(r.output.split()), r.output


def test_dashboard_arms_page_shows_the_contrasts(study: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboards.conftest import APP

    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_DB", str(study / "sc.db"))
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.run()
    at.switch_page("pages/arms.py").run()
    assert not at.exception, [e.value for e in at.exception]
    labels = [m.label for m in at.metric]
    assert any(lbl.startswith("speed: spark vs spark-slowed") for lbl in labels), labels
    assert any(lbl.startswith("capability: codex vs spark-slowed") for lbl in labels), labels


def test_template_parses() -> None:
    cfg = parse_study(tomllib.loads(speed_vs_capability_text()))
    assert [a.latency for a in cfg.arms] == ["natural", "matched", "natural"]


def test_task_effects_notebook_shows_the_contrasts(study: Path, tmp_path: Path) -> None:
    from tests.analysis.test_notebooks import run_notebook

    nb = run_notebook("task_effects.ipynb", study / "sc.db", tmp_path)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "capability" in text and "spark-slowed" in text
    assert "attempts_per_task" in text and "Not a speed-vs-capability design" not in text


def test_live_study_through_the_proxy(tmp_path: Path) -> None:
    """Live: simulated people through the real proxy, each arm on its own simulated upstream
    (compressed speeds: raw 3 ms / 100k tokens/s and 25 ms / 7.5k tokens/s at time_scale 100),
    the matched arm drawing codex's recorded latencies once it has 4; then the report."""
    runner = CliRunner()
    study = tmp_path / "live.toml"
    assert runner.invoke(app, ["init", str(study), "--template", "speed-vs-capability"]
                         ).exit_code == 0
    text = study.read_text()
    for old, new in [("periods = 6                    # two tasks per arm", "periods = 3"),
                     ("time_scale = 1\n", "time_scale = 100\n"),
                     ("matched_after = 30 ", "matched_after = 4 "),
                     ("ttft_ms = 300\ntokens_per_second = 1000",
                      "ttft_ms = 3\ntokens_per_second = 100000"),
                     ("ttft_ms = 2500\ntokens_per_second = 75\n\n[[arms]]\nname = \"spark\"",
                      "ttft_ms = 25\ntokens_per_second = 7500\n\n[[arms]]\nname = \"spark\"")]:
        assert old in text, old
        text = text.replace(old, new)
    study.write_text(text)
    db = tmp_path / "live.db"
    r = runner.invoke(app, ["simulate", "--study", str(study), "--db", str(db), "--mode", "live",
                            "--participants", "4", "--tasks", "3", "--prompts-per-task", "4",
                            "--seed", "3", "--model", "gpt-5.3-codex-spark=0.5",
                            "--model", "gpt-5.3-codex=0.8"])
    assert r.exit_code == 0, r.output
    import sqlite3

    with sqlite3.connect(db) as conn:
        served = dict(conn.execute("SELECT arm, served_model FROM cycles GROUP BY arm"))
        sources = dict(conn.execute(
            "SELECT json_extract(draw_json, '$.source'), count(*) FROM cycles "
            "WHERE arm = 'spark-slowed' GROUP BY 1"))
    assert served == {"spark": "gpt-5.3-codex-spark", "spark-slowed": "gpt-5.3-codex-spark",
                      "codex": "gpt-5.3-codex"}
    assert sources.get("recorded", 0) > 0  # switched from the prior to codex's latencies
    r = runner.invoke(app, ["analyze", "--db", str(db), "--out", str(tmp_path / "rep"),
                            "--n-boot", "10"])
    assert r.exit_code == 0, r.output
    sc = json.loads((tmp_path / "rep" / "results.json").read_text())["speed_capability"]
    assert {c["contrast"] for c in sc["contrasts"]} == {"speed", "capability", "naive"}
    (m,) = sc["matched_latency"]
    assert m["ok"], m  # the slowed fast model delivered codex's latency
    assert all(s["ok"] for s in sc["served_models"])
