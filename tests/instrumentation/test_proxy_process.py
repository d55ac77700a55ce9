"""The proxy as a process: the CLI command's input errors, graceful SIGTERM, and kill -9
losing nothing a client saw complete."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from instrumentation.proxy.__main__ import main
from study.config import load_study
from study.participants import enroll
from study.storage import init_db

ROOT = Path(__file__).resolve().parents[2]
STUDY = """
[study]
name = "kill-test"
design = "parallel"
[upstream.mock]
tokens_per_second = 20000
ttft_ms = 1
[[arms]]
name = "shaped"
ttft_ms = 40
tokens_per_second = 300
"""


def setup_study(tmp_path: Path, text: str = STUDY) -> tuple[Path, Path, str]:
    study = tmp_path / "study.toml"
    study.write_text(text, encoding="utf-8")
    db = tmp_path / "study.db"
    config = load_study(study)
    database = init_db(db, config, text)
    key = enroll(database, config, "p01")[1]
    database.dispose()
    return study, db, key


def start_proxy(study: Path, db: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "instrumentation.proxy", "--study", str(study), "--db", str(db),
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("OPENAI_BASE_URL="):
            return proc, line.strip().split("=", 1)[1].removesuffix("/v1")
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"proxy did not start: {proc.stderr.read() if proc.stderr else ''}")


def wait_healthy(url: str, timeout: float = 30) -> None:
    """The URL is printed once the socket listens; wait until the app answers too."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/flowtrial/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "proxy never became healthy"
        time.sleep(0.05)


def test_kill_9_loses_no_stream_the_client_saw_complete(tmp_path: Path) -> None:
    study, db, key = setup_study(tmp_path)
    proc, url = start_proxy(study, db)
    wait_healthy(url)
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        body = {"model": "flowtrial-sim-1", "stream": True, "max_tokens": 25,
                "messages": [{"role": "user", "content": f"python question {i}"}]}
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                cid, done = "", False
                try:
                    with http.stream("POST", url + "/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {key}"}) as r:
                        cid = r.headers["x-flowtrial-cycle-id"]
                        for line in r.iter_lines():
                            if line == "data: [DONE]":
                                done = True
                except httpx.HTTPError:
                    pass
                if cid:
                    with lock:
                        results.append((cid, done))
                if not done and cid:
                    return  # the proxy is gone

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while sum(done for _, done in results) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # mid-traffic: several streams are open right now
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(15)
    completed = {cid for cid, done in results if done}
    cut = [cid for cid, done in results if not done]
    assert len(completed) >= 8 and cut, (len(completed), len(cut))
    con = sqlite3.connect(db)
    recorded = {r[0] for r in con.execute("SELECT id FROM cycles")}
    con.close()
    assert completed <= recorded, f"lost: {sorted(completed - recorded)}"


def test_sigterm_stops_cleanly_and_drains(tmp_path: Path) -> None:
    study, db, key = setup_study(tmp_path)
    proc, url = start_proxy(study, db)
    wait_healthy(url)
    r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": "m", "max_tokens": 5,
                         "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert r.status_code == 200
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "1 cycles recorded" in err


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    old = sys.argv
    sys.argv = ["flowtrial-proxy", *argv]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    return int(exc.value.code or 0), capsys.readouterr().err


def test_cli_input_errors_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    study, db, _ = setup_study(tmp_path)
    code, err = run_main(["--study", str(tmp_path / "missing.toml"), "--db", str(db)], capsys)
    assert code == 2 and "file not found" in err

    monkeypatch.delenv("FT_NOT_SET_ANYWHERE", raising=False)
    real = tmp_path / "real.toml"
    real.write_text("""
[study]
name = "real"
design = "parallel"
[upstream]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "FT_NOT_SET_ANYWHERE"
[[arms]]
name = "team"
""", encoding="utf-8")
    code, err = run_main(["--study", str(real), "--db", str(tmp_path / "r.db")], capsys)
    assert code == 2 and "FT_NOT_SET_ANYWHERE" in err and "not set" in err

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        code, err = run_main(["--study", str(study), "--db", str(db), "--port", str(port)],
                             capsys)
    finally:
        busy.close()
    assert code == 2 and "cannot listen" in err
