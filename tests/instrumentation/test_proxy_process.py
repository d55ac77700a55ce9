"""The proxy as a process: the CLI command's input errors, graceful SIGTERM, and kill -9
losing nothing a client saw complete."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flowtrial.proxy_assembly import main
from flowtrial.study.config import load_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db

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


def start_proxy(study: Path, db: Path | str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`flowtrial proxy` as a process on a free port (``extra``: more CLI options)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.proxy_assembly", "--study", str(study),
         "--db", str(db), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
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


async def _stream_forever(host: str, port: int, key: str, i: int, seen: dict[str, bool],
                         stop: asyncio.Event) -> None:
    """One client looping streaming requests over raw sockets (light enough that 40 of them
    in one event loop keep up): ``seen[cycle id]`` is True once the client has read
    ``[DONE]``, False while (or if) the stream is open without it."""
    body = json.dumps({"model": "flowtrial-sim-1", "stream": True, "max_tokens": 25,
                       "messages": [{"role": "user", "content": f"python question {i}"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}").encode()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return  # the proxy is gone
        cid = None
        buf = b""
        try:
            writer.write(head)
            while data := await reader.read(65536):
                buf += data
                if cid is None and (m := re.search(rb"x-flowtrial-cycle-id: (\S+)\r\n", buf)):
                    cid = m.group(1).decode()
                    seen[cid] = False
                if cid is not None and b"data: [DONE]" in buf:
                    seen[cid] = True
        except OSError:
            pass
        finally:
            writer.close()
        if cid is not None and not seen[cid]:
            return  # cut: the proxy is gone


def test_kill_9_loses_no_stream_the_client_saw_complete(tmp_path: Path) -> None:
    """40 concurrent streaming clients, then SIGKILL mid-traffic: every cycle a client saw
    complete (read its [DONE]) is in the database, recorded ok; the only other rows are of
    streams cut by the kill (committed, final event not yet read); nothing else."""
    study, db, key = setup_study(tmp_path, STUDY.replace("ttft_ms = 40", "ttft_ms = 150"))
    proc, url = start_proxy(study, db)
    wait_healthy(url)
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    seen: dict[str, bool] = {}
    streams = 40

    async def load() -> int:
        stop = asyncio.Event()
        clients = [asyncio.create_task(_stream_forever(host, int(port), key, i, seen, stop))
                   for i in range(streams)]
        deadline = time.monotonic() + 30

        def open_now() -> int:
            return sum(1 for done in seen.values() if not done)

        # Kill at a moment when many streams are open: on a busy machine the clients can
        # fall into step and all be between requests at once.
        while (sum(seen.values()) < 2 * streams or open_now() < streams // 2) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        open_at_kill = open_now()
        os.kill(proc.pid, signal.SIGKILL)  # mid-traffic: dozens of streams are open
        stop.set()
        await asyncio.wait_for(asyncio.gather(*clients), 20)
        return open_at_kill

    open_at_kill = asyncio.run(load())
    proc.wait(10)
    completed = {cid for cid, done in seen.items() if done}
    cut = {cid for cid, done in seen.items() if not done}
    con = sqlite3.connect(db)
    recorded = dict(con.execute("SELECT id, status FROM cycles").fetchall())
    con.close()
    assert len(completed) >= 2 * streams and open_at_kill >= streams // 2, (
        len(completed), open_at_kill)
    assert cut, "no stream was open at the kill"
    assert completed <= recorded.keys(), f"lost: {sorted(completed - recorded.keys())}"
    assert recorded.keys() - completed <= cut  # nothing recorded that no client asked for
    assert set(recorded.values()) == {"ok"}
    print(f"kill -9 under {streams} streams: {len(completed)} client-complete, all recorded; "
          f"{len(cut)} cut ({len(cut & recorded.keys())} of them committed before the kill)")


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


def test_observe_study_prints_the_telemetry_endpoint_not_model_urls(tmp_path: Path) -> None:
    """A team study has no model traffic through the proxy: it says where telemetry goes."""
    text = ('[study]\nname = "team"\ndesign = "observe"\nunit = "participant"\n')
    study = tmp_path / "team.toml"
    study.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.proxy_assembly", "--study", str(study), "--db",
         str(tmp_path / "team.db"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Health:" in ln for ln in lines):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
    finally:
        proc.terminate()
        proc.wait(30)
    out = "".join(lines)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" in out and "/flowtrial/otlp" in out
    assert "OPENAI_BASE_URL" not in out and "ANTHROPIC_BASE_URL" not in out
