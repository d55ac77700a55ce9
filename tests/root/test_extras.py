"""Every command without each optional extra: ``--help`` works, and starting it either works
or says in one line which extra to install (exit code 2); never a traceback.

Each optional package is hidden in a subprocess (``tests/root/hidden_extras.py``) the way a
missing one is missing; the proxy is started with nothing but its own extra and answers the
official SDK (the README's study install crashed on a missing OpenTelemetry, issue 26).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowtrial.cli import COMMANDS
from flowtrial.study.config import example_study_text
from flowtrial.study.extras import EXTRAS, install_hint
from tests.pg_server import free_port

ROOT = Path(__file__).resolve().parents[2]
#: Commands that start a server or run for long: started here only where a hidden extra
#: must stop them at once (their running is tested elsewhere and in the install matrix).
SLOW = {"demo", "proxy", "mock-model", "analyze", "power", "notebooks", "dashboard",
        "simulate-live"}


@dataclass(frozen=True)
class Run:
    argv: list[str]
    needs: tuple[str, ...] = ()  # extras it cannot run without
    codes: tuple[int, ...] = (0,)  # exit codes when it has them (2: a one-line refusal)


def _runs(d: Path) -> dict[str, Run]:
    study, db = str(d / "study.toml"), str(d / "study.db")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    runs = {
        "demo": Run(["demo", "--dir", str(d / "demo"), "--participants", "2"]),
        "init": Run(["init", str(d / "new.toml")]),
        "validate": Run(["validate", "--study", study]),
        "enroll": Run(["enroll", "--study", study, "--db", str(d / "e.db"),
                       "--participant", "p01"]),
        "status": Run(["status", "--db", db]),
        "status-postgres": Run(["status", "--db", "postgresql://u@127.0.0.1:1/none"],
                               ("postgres",), (2,)),
        "migrate": Run(["migrate", "--db", db]),
        "proxy": Run(["proxy", "--study", study, "--db", db, "--port", "0"]),
        "mock-model": Run(["mock-model", "--port", "0"]),
        "simulate": Run(["simulate", "--study", study, "--db", str(d / "sim.db"),
                         "--participants", "2", "--tasks", "1", "--prompts-per-task", "2"]),
        "simulate-live": Run(["simulate", "--study", study, "--db", str(d / "live.db"),
                              "--participants", "1", "--tasks", "1", "--prompts-per-task",
                              "1", "--mode", "live"], ("demo",)),
        "import-activitywatch": Run(["import-activitywatch", "--db", db, "--participant",
                                     "p01", "--server", dead], ("activitywatch",), (2,)),
        "import-otel": Run(["import-otel", "--db", db, "--participant", "p01",
                            str(d / "otel.json")]),
        "codex-notify": Run(["codex-notify", "{}", "--url", dead], codes=(2,)),
        "persistence": Run(["persistence", "--db", db]),
        "analyze": Run(["analyze", "--db", db, "--out", str(d / "report")]),
        "turns": Run(["turns", "--db", db]),
        "effect": Run(["effect", str(d / "tasks.csv"), "--time", "t", "--treatment", "arm"]),
        "threshold": Run(["threshold", str(d / "waits.csv"), "--n-boot", "2", "--n-null", "2",
                          "--workers", "1"], codes=(0, 2)),
        "power": Run(["power", "--study", study]),
        "notebooks": Run(["notebooks", "--db", db, "--no-browser", "--port", "1"]),
        "dashboard": Run(["dashboard", "--db", db, "--port", "1"]),
        "export": Run(["export", "--db", db, "--out", str(d / "export"), "--format",
                       "parquet"], ("parquet",)),
        # Field and team commands (their own database: withdrawing p01 of the shared one
        # would change what the other commands see).
        "withdraw": Run(["withdraw", "--db", str(d / "e.db"), "--participant", "p01"],
                        codes=(0, 2)),
        "onboard": Run(["onboard", "--study", study, "--participant", "p01", "--client",
                        "codex"], codes=(0, 2)),
        "team-token": Run(["team-token", "--db", db], codes=(0, 2)),
        "sync-activitywatch": Run(["sync-activitywatch", "--proxy", dead, "--key", "ft_x",
                                   "--aw", dead], codes=(2,)),
    }
    for name, run in runs.items():  # the command table's own needs
        command = name.split("-")[0] if name not in COMMANDS else name
        runs[name] = Run(run.argv, tuple(dict.fromkeys(COMMANDS[command].needs + run.needs)),
                         run.codes)
    return runs


def test_every_command_is_exercised() -> None:
    assert set(COMMANDS) <= set(_runs(Path("/x")))


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("extras")
    text = example_study_text().replace(
        'ttft_ms = { min = 200, max = 30000, scale = "log" }',
        'ttft_ms = { min = 20, max = 40, scale = "log" }')
    (d / "study.toml").write_text(text, encoding="utf-8")
    subprocess.run([sys.executable, "-m", "flowtrial", "simulate", "--study", str(d / "study.toml"),
                    "--db", str(d / "study.db"), "--participants", "3", "--tasks", "2",
                    "--prompts-per-task", "3", "--seed", "1"], check=True, capture_output=True,
                   timeout=300)
    subprocess.run([sys.executable, "-m", "flowtrial", "enroll", "--study", str(d / "study.toml"),
                    "--db", str(d / "study.db"), "--participant", "p01"], check=True,
                   capture_output=True, timeout=120)
    (d / "otel.json").write_text('{"resourceLogs": []}\n', encoding="utf-8")
    (d / "tasks.csv").write_text("t,arm\n" + "".join(
        f"{10 + i % 7 + 3 * (i % 2)},{i % 2}\n" for i in range(24)), encoding="utf-8")
    (d / "waits.csv").write_text("wait_s,switched,participant_id\n" + "".join(
        f"{0.5 + i % 9},{int(i % 9 > 5)},p{i % 4}\n" for i in range(72)), encoding="utf-8")
    return d


def _hidden(extra: str) -> list[str]:
    return list(dict.fromkeys(EXTRAS[extra]))


def _lacks(needed: str, hidden: list[str]) -> bool:
    return any(m == h or m.startswith(h + ".") for m in EXTRAS[needed] for h in hidden)


def _run_hidden(hidden: list[str], runs: list[tuple[str, list[str]]]) -> dict[str, dict]:
    job = json.dumps({"hide": hidden, "runs": runs})
    proc = subprocess.run([sys.executable, "-m", "tests.root.hidden_extras", job],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_every_command_without_the_extra(extra: str, study_dir: Path) -> None:
    """``--help`` of every command; start-up of each (those that need ``extra``: one line
    naming the extra to install, exit 2, before anything is printed or written)."""
    hidden = _hidden(extra)
    work = study_dir / extra
    work.mkdir()
    for name in ("study.toml", "study.db", "otel.json", "tasks.csv", "waits.csv"):
        (work / name).write_bytes((study_dir / name).read_bytes())
    runs = _runs(work)
    jobs = [(f"help {name}", [name, "--help"]) for name in COMMANDS]
    expect: dict[str, tuple[Run, str | None]] = {}
    for name, run in runs.items():
        lacking = next((e for e in run.needs if _lacks(e, hidden)), None)
        if lacking is None and name in SLOW:
            continue
        expect[name] = (run, lacking)
        jobs.append((name, run.argv))
    got = _run_hidden(hidden, jobs)
    for name in COMMANDS:
        res = got[f"help {name}"]
        assert res["code"] == 0 and res["traceback"] is None, (name, res)
        assert "Usage: flowtrial" in res["stdout"], (name, res)
    for name, (run, lacking) in expect.items():
        res = got[name]
        assert res["traceback"] is None, (name, res["traceback"])
        lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
        if lacking is not None:
            assert res["code"] == 2, (name, res)
            assert len(lines) == 1 and install_hint(lacking) in lines[0], (name, res)
            assert res["stdout"] == "", (name, res)  # no URL, no partial output
        else:
            assert res["code"] in run.codes, (name, res)
            if res["code"] == 2:
                assert len(lines) == 1 and lines[0].startswith("error:"), (name, res)
    assert not (work / "report").exists() and not (work / "demo").exists()


def test_the_proxy_serves_with_nothing_but_its_extra(study_dir: Path) -> None:
    """`flowtrial proxy` after `pip install 'flowtrial[proxy]'` alone: it starts, says in its
    log that agent telemetry is off, answers the official SDK, and stops on SIGTERM."""
    import openai

    from flowtrial.study.participants import enroll
    from flowtrial.study.storage import open_db

    own = set(EXTRAS["proxy"])
    hidden = [m for m in dict.fromkeys(sum(EXTRAS.values(), ())) if m not in own]
    work = study_dir / "proxy-only"
    work.mkdir()
    db = work / "study.db"
    db.write_bytes((study_dir / "study.db").read_bytes())
    database = open_db(str(db))
    try:
        _, key, _ = enroll(database, database.config(), "solo")
    finally:
        database.dispose()
    port = free_port()
    job = json.dumps({"hide": hidden, "runs": [["proxy", [
        "proxy", "--study", str(study_dir / "study.toml"), "--db", str(db), "--port",
        str(port)]]]})
    log = work / "proxy.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "tests.root.hidden_extras", job],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the proxy did not come up"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/flowtrial/v1/health",
                                       timeout=2).close()
                break
            except OSError:
                time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key,
                               max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="flowtrial-mock", messages=[{"role": "user", "content": "Say hello"}])
        assert reply.choices[0].message.content
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads(out.splitlines()[-1])["proxy"]
    assert result["traceback"] is None, result["traceback"]
    text = log.read_text() + result["stderr"]
    assert "agent telemetry (OTLP) off" in text and install_hint("telemetry") in text
