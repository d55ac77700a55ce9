"""No secret at rest or in logs: the upstream API key, the admin token and every participant
key are absent from the database files (SQLite file, WAL and shared memory, while the proxy
runs and after it stopped), from everything ``flowtrial proxy`` printed (stdout and stderr of
the real process) and from every ``flowtrial export`` output (CSV and Parquet, plain and
de-identified).

The proxy runs as users run it (``python -m study.cli proxy``) in front of a real upstream
that *needs* the key: the simulated model behind a gate that refuses any request without
the study's upstream key and records the headers it got — so the test also proves the key
went upstream (and participant keys did not). Traffic covers every protocol, streaming and
not, the Responses WebSocket mode, count_tokens, models, the event API, Continue, the
participant page login, the admin endpoints, wrong keys, a key in a URL and a malformed
HTTP request.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from typer.testing import CliRunner
from websockets.sync.client import connect as ws_connect

from flowtrial.cli import app as cli
from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.app import create_mock_app
from flowtrial.instrumentation.participant_page import PREFIX
from flowtrial.study.config import load_study
from flowtrial.study.keys import split_key
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db
from tests.instrumentation.servers import run_asgi_server

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "FT_SECRETS_UPSTREAM_KEY"
ADMIN_ENV = "FT_SECRETS_ADMIN_TOKEN"
MODEL = "flowtrial-sim-1"
STUDY = """
[study]
name = "secrets-test"
design = "parallel"

[[arms]]
name = "team"

[upstream]
kind = "openai"
timeout_s = 20

[upstream.openai]
base_url = "{up}/v1"
api_key_env = "{key_env}"

[upstream.anthropic]
base_url = "{up}"
api_key_env = "{key_env}"

[capture]
content = "full"

[proxy]
admin_token_env = "{admin_env}"
"""


class KeyGate:
    """ASGI: refuses (401 / WebSocket close) any request without the upstream key, records
    the headers of every request, then passes it to the simulated model."""

    def __init__(self, inner: Any, key: str) -> None:
        self.inner = inner
        self.key = key
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.inner(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.seen.append({"path": scope["path"], **headers})
        if headers.get("authorization") == f"Bearer {self.key}" or \
                headers.get("x-api-key") == self.key:
            await self.inner(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": "Incorrect API key provided",
                                     "type": "invalid_request_error"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class Proxy:
    """``flowtrial proxy`` as a subprocess; its output is collected by reader threads."""

    def __init__(self, study: Path, db: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowtrial.cli", "proxy", "--study", str(study), "--db", str(db),
             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=ROOT, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self._threads = [threading.Thread(target=self._pump, args=(s, buf), daemon=True)
                         for s, buf in ((self.proc.stdout, self.out),
                                        (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, buf: list[str]) -> None:
        for line in stream:
            buf.append(line)
            if m := re.match(r"ANTHROPIC_BASE_URL=(\S+)", line):
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 60) -> str:
        self._ready.wait(timeout)
        if self.url is None:
            self.stop()
            pytest.fail("flowtrial proxy did not start:\n" + "".join(self.err)[-3000:])
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/flowtrial/v1/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "proxy never became healthy"
            time.sleep(0.05)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(5)
        return "".join(self.out) + "".join(self.err)


@pytest.fixture
def gate() -> Iterator[tuple[KeyGate, str]]:
    key = "sk-proj-" + secrets.token_urlsafe(32)
    g = KeyGate(create_mock_app(MockModel(tokens_per_second=1e6, ttft_ms=0)), key)
    with run_asgi_server(g) as url:
        yield g, url


def _files_text(paths: list[Path]) -> dict[str, bytes]:
    out = {}
    for p in paths:
        raw = p.read_bytes()
        if p.suffix == ".parquet":  # compressed columns: search the decoded table too
            raw += pd.read_parquet(p).to_csv(index=False).encode()
        out[str(p)] = raw
    return out


def _assert_absent(secrets_: dict[str, str], blobs: dict[str, bytes], where: str) -> None:
    assert blobs, f"nothing to search in {where}"
    for name, secret in secrets_.items():
        needle = secret.encode()
        for path, blob in blobs.items():
            assert needle not in blob, f"{name} found in {where}: {path}"


def test_no_secret_in_database_logs_or_exports(tmp_path: Path, gate: Any) -> None:
    g, upstream_url = gate
    admin_token = secrets.token_urlsafe(32)
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(up=upstream_url, key_env=KEY_ENV, admin_env=ADMIN_ENV),
                     encoding="utf-8")
    db = tmp_path / "study.db"
    config = load_study(study)
    database = init_db(db, config, study.read_text(encoding="utf-8"))
    keys = {pid: enroll(database, config, pid)[1] for pid in ("alice", "bob")}
    database.dispose()
    secrets_ = {"upstream key": g.key, "admin token": admin_token}
    for pid, k in keys.items():
        secrets_[f"{pid}'s key"] = k
        secrets_[f"{pid}'s key secret"] = split_key(k)[1]  # type: ignore[index]

    env = {**os.environ, "PYTHONPATH": str(ROOT), KEY_ENV: g.key, ADMIN_ENV: admin_token}
    proxy = Proxy(study, db, env)
    try:
        url = proxy.wait_ready()
        _traffic(url, keys, admin_token)
        # While the proxy runs: the database file, its WAL and shared memory.
        live = sorted(p for p in tmp_path.iterdir() if p.name.startswith("study.db"))
        assert any(p.name.endswith("-wal") for p in live), live
        blobs = _files_text(live)
        _assert_absent(secrets_, blobs, "the live database files")
        # Positive control: the search does see what was recorded (ids, prompt text).
        assert any(b"def add(a, b):" in v for v in blobs.values())
    finally:
        logs = proxy.stop()
    assert proxy.proc.returncode == 0, logs[-2000:]
    assert "OPENAI_BASE_URL=" in logs and "cycles recorded" in logs  # we did read its output
    _assert_absent(secrets_, {"proxy stdout+stderr": logs.encode()}, "the proxy's output")

    # The upstream got the study's key on every request, and never a participant's key.
    assert len(g.seen) >= 8
    for req in g.seen:
        assert req.get("authorization") == f"Bearer {g.key}" or req.get("x-api-key") == g.key
        values = " ".join(req.values())
        for pid, k in keys.items():
            assert split_key(k)[1] not in values, f"{pid}'s key went upstream"  # type: ignore

    # At rest after shutdown, and in every export.
    rest = sorted(p for p in tmp_path.iterdir() if p.name.startswith("study.db"))
    _assert_absent(secrets_, _files_text(rest), "the database files")
    runner = CliRunner()
    exported: list[Path] = []
    for fmt in ("csv", "parquet"):
        for deid in (False, True):
            out = tmp_path / f"export-{fmt}-{deid}"
            args = ["export", "--db", str(db), "--out", str(out), "--format", fmt]
            r = runner.invoke(cli, args + (["--deidentify"] if deid else []))
            assert r.exit_code == 0, r.output
            _assert_absent(secrets_, {"cli output": r.output.encode()}, "export's output")
            exported += sorted(out.iterdir())
    assert len(exported) >= 4 * 10
    blobs = _files_text(exported)
    _assert_absent(secrets_, blobs, "the exports")
    assert any(b"def add(a, b):" in v for v in blobs.values())  # positive control
    # The traffic did land: cycles of both participants, the full content captured.
    cycles = pd.read_csv(tmp_path / "export-csv-False" / "cycles.csv")
    assert set(cycles["participant_id"]) == {"alice", "bob"} and len(cycles) == 7
    assert cycles["content_text"].notna().any() and "websocket" in set(cycles["transport"])


def _traffic(url: str, keys: dict[str, str], admin_token: str) -> None:
    """Every kind of request the proxy serves, with the participants' keys."""
    a, b = keys["alice"], keys["bob"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "def add(a, b):"}],
            "max_tokens": 12}
    with httpx.Client(base_url=url, timeout=30) as c:
        def ok(r: httpx.Response) -> httpx.Response:
            assert r.status_code == 200, (r.request.url, r.status_code, r.text[:300])
            return r

        cid = ok(c.post("/v1/chat/completions", json=chat, headers={
            "authorization": f"Bearer {a}"})).headers["x-flowtrial-cycle-id"]
        ok(c.post("/v1/chat/completions", json={**chat, "stream": True,
                                                "stream_options": {"include_usage": True}},
                  headers={"authorization": f"Bearer {b}"}))
        ok(c.post("/v1/completions", json={"model": MODEL, "prompt": "import os\n",
                                           "suffix": "\n", "max_tokens": 8},
                  headers={"authorization": f"Bearer {a}"}))
        ok(c.post("/v1/responses", json={"model": MODEL, "input": "write a loop",
                                         "stream": True, "max_output_tokens": 16},
                  headers={"authorization": f"Bearer {b}"}))
        msg = {"model": MODEL, "max_tokens": 12,
               "messages": [{"role": "user", "content": "sort a list"}]}
        ok(c.post("/v1/messages", json=msg, headers={"x-api-key": a}))
        ok(c.post("/v1/messages", json={**msg, "stream": True}, headers={"x-api-key": b}))
        ok(c.post("/v1/messages/count_tokens", json={"model": MODEL,
                                                     "messages": msg["messages"]},
                  headers={"x-api-key": a}))
        ok(c.get("/v1/models", headers={"authorization": f"Bearer {b}"}))
        ok(c.post("/flowtrial/v1/events", json={"events": [
            {"kind": "accept", "cycle_id": cid},
            {"kind": "focus_out", "payload": {"app": "Slack", "title": "standup"}}]},
            headers={"authorization": f"Bearer {a}"}))
        ok(c.post("/flowtrial/v1/continue", json={
            "name": "autocomplete", "data": {"accepted": True, "completionId": cid}},
            headers={"authorization": f"Bearer {a}"}))
        ok(c.get("/flowtrial/v1/admin/status",
                 headers={"authorization": f"Bearer {admin_token}"}))
        ok(c.get("/flowtrial/v1/admin/participants",
                 headers={"authorization": f"Bearer {admin_token}"}))
        # Participant page: the key is posted once in a form.
        r = c.post(f"{PREFIX}/login", data={"key": a})
        assert r.status_code == 303 and a not in r.headers.get("set-cookie", "")
        # Wrong and misplaced keys: right key id with a wrong secret, another key shape, the
        # upstream key itself, a key in a URL, and the admin token where a key belongs.
        for bad in (a[:-3] + "xyz", "ft_nothing_here", admin_token):
            r = c.post("/v1/chat/completions", json=chat,
                       headers={"authorization": f"Bearer {bad}"})
            assert r.status_code == 401 and bad not in r.text
        r = c.post(f"/v1/chat/completions?api_key={b}", json=chat)
        assert r.status_code == 401 and b not in r.text
        r = c.post(f"{PREFIX}/login", data={"key": b[:-2] + "zz"})
        assert r.status_code == 401 and b[:-2] not in r.text
        r = c.get("/flowtrial/v1/admin/status", headers={"authorization": f"Bearer {a}"})
        assert r.status_code == 403 and a not in r.text
    # The Responses WebSocket mode (the upstream socket gets the key too).
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    with ws_connect(ws_url, additional_headers={"authorization": f"Bearer {a}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hello",
                            "max_output_tokens": 8}))
        while json.loads(ws.recv(timeout=20))["type"] not in ("response.completed",
                                                              "response.incomplete"):
            pass
    # A malformed HTTP request carrying a key: whatever the server logs, not the key.
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET /v1/models?key={a} HTTP/1.1\r\nHost: x\r\nX-Bad\x00: {a}\r\n\r\n"
                  .encode())
        try:
            s.recv(4096)
        except OSError:
            pass
