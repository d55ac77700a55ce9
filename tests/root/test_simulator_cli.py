"""`flowtrial simulate` / `flowtrial demo` through typer's CliRunner."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from flowtrial.simulate_commands import demo, simulate
from flowtrial.study.config import example_study_text
from flowtrial.study.storage import open_db

runner = CliRunner()


def make_app() -> typer.Typer:
    app = typer.Typer()
    app.command("simulate")(simulate)
    app.command("demo")(demo)
    return app


def test_simulate_virtual_writes_the_study(tmp_path: Path, study_file: Path) -> None:
    db = tmp_path / "sim.db"
    r = runner.invoke(make_app(), [
        "simulate", "--study", str(study_file), "--db", str(db), "--participants", "5",
        "--tasks", "2", "--prompts-per-task", "4", "--truth", "smooth", "--threshold-s", "5",
        "--threshold-sd", "0.2", "--seed", "9",
    ])
    assert r.exit_code == 0, r.output
    assert "Simulated 5 participants (virtual, truth=smooth" in r.output
    database = open_db(db)
    with database.engine.connect() as c:
        cycles = pd.read_sql("SELECT participant_id FROM cycles", c)
        gt = pd.read_sql("SELECT * FROM ground_truth WHERE scope = 'population'", c)
    assert len(cycles) == 5 * 2 * 4 and cycles["participant_id"].nunique() == 5
    pop = json.loads(gt["params_json"].iloc[0])
    assert pop["truth_model"] == "smooth" and pop["threshold_s"] == 5.0
    assert pop["threshold_logsd"] == 0.2 and pop["seed"] == 9


@pytest.mark.parametrize("args, message", [
    (["--participants", "0"], "--participants 0: need at least 1"),
    (["--participants", "2", "--mode", "replay"], "--mode 'replay' is not a mode"),
    (["--participants", "2", "--truth", "step"], "--truth 'step' is not a truth model"),
    (["--participants", "2", "--threshold-s", "0"], "--threshold-s 0: must be > 0"),
    (["--participants", "2", "--prompts-per-task", "0"], "--prompts-per-task 0"),
])
def test_simulate_bad_input_is_one_line_exit_2(
    tmp_path: Path, study_file: Path, args: list[str], message: str
) -> None:
    r = runner.invoke(make_app(), ["simulate", "--study", str(study_file), "--db",
                                   str(tmp_path / "x.db"), *args])
    assert r.exit_code == 2
    assert message in r.output
    assert not (tmp_path / "x.db").exists()


def test_simulate_missing_study_file(tmp_path: Path) -> None:
    r = runner.invoke(make_app(), ["simulate", "--study", str(tmp_path / "nope.toml"), "--db",
                                   str(tmp_path / "x.db"), "--participants", "1"])
    assert r.exit_code == 2
    assert "file not found" in r.output and len(r.output.strip().splitlines()) == 1


def test_simulate_live_through_the_proxy(tmp_path: Path) -> None:
    pytest.importorskip("flowtrial.instrumentation.proxy.server")
    text = example_study_text().replace("time_scale = 1 ", "time_scale = 200 ")
    assert tomllib.loads(text)["study"]["time_scale"] == 200
    study = tmp_path / "study.toml"
    study.write_text(text.replace("min = 200, max = 30000", "min = 2000, max = 30000"))
    db = tmp_path / "live.db"
    r = runner.invoke(make_app(), [
        "simulate", "--study", str(study), "--db", str(db), "--participants", "2", "--tasks",
        "1", "--prompts-per-task", "3", "--mode", "live", "--seed", "1",
    ])
    assert r.exit_code == 0, r.output
    assert "(live, truth=hinge" in r.output
    # 2000 ms / 200 = 10 ms, shorter than the example's simulated model (20 ms): warned.
    assert "warning: [per_prompt] ttft_ms.min = 2000 ms is 10.0 ms at time_scale 200" in r.output
    with open_db(db).engine.connect() as c:
        cyc = pd.read_sql("SELECT * FROM cycles", c)
        ev = pd.read_sql("SELECT kind, cycle_id FROM events", c)
    assert len(cyc) == 6 and cyc["simulated"].all()
    decided = ev[ev["kind"].isin(["accept", "reject", "partial_accept"])]["cycle_id"]
    assert sorted(decided) == sorted(cyc["id"])


def test_simulate_live_agent_steps(tmp_path: Path) -> None:
    """--mode live --agent-steps 3: the proxy records turns of 3 calls; a real upstream is
    refused in one line."""
    pytest.importorskip("flowtrial.instrumentation.proxy.server")
    text = example_study_text().replace("time_scale = 1 ", "time_scale = 200 ")
    study = tmp_path / "study.toml"
    study.write_text(text.replace("min = 200, max = 30000", "min = 5000, max = 30000"))
    db = tmp_path / "agent.db"
    args = ["simulate", "--study", str(study), "--db", str(db), "--participants", "1",
            "--tasks", "1", "--prompts-per-task", "2", "--mode", "live", "--agent-steps", "3",
            "--seed", "4"]
    r = runner.invoke(make_app(), args)
    assert r.exit_code == 0, r.output
    with open_db(db).engine.connect() as c:
        kinds = pd.read_sql("SELECT request_kind FROM cycles ORDER BY t_request_ns", c)
        turns = pd.read_sql("SELECT model_calls, tool_ms FROM turns", c)
    assert list(kinds["request_kind"]) == ["human", "continuation", "continuation"] * 2
    assert list(turns["model_calls"]) == [3, 3] and (turns["tool_ms"] > 0).all()
    real = text.replace('kind = "mock"  ', 'kind = "openai"')
    real = real.replace('# base_url = "https://api.openai.com/v1"',
                        'base_url = "http://127.0.0.1:9/v1"', 1)
    real = real.replace('# api_key_env = "OPENAI_API_KEY"', 'api_key_env = "OPENAI_API_KEY"', 1)
    study.write_text(real)
    r = runner.invoke(make_app(), [*args[:4], str(tmp_path / "real.db"), *args[5:]])
    assert r.exit_code == 2 and "needs the simulated model" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "real.db").exists()


def test_demo_bad_input(tmp_path: Path) -> None:
    r = runner.invoke(make_app(), ["demo", "--dir", str(tmp_path / "d"), "--participants", "0"])
    assert r.exit_code == 2 and "--participants 0" in r.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("mine")
    r = runner.invoke(make_app(), ["demo", "--dir", str(busy)])
    assert r.exit_code == 2 and "not a flowtrial demo directory" in r.output
    assert (busy / "thesis.tex").exists()
