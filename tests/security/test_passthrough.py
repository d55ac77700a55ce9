"""Pass-through credentials (``credentials = "participant"``): each participant's own
provider credential reaches the upstream, untouched, and is kept nowhere.

``flowtrial proxy`` runs as users run it, in front of a real upstream that answers only the
participants' *own* credentials (an OpenAI key, an Anthropic OAuth bearer token as Claude
Code sends it on a subscription, a Gemini API key) and records what it got. The
participants are identified apart from that credential: by ``x-flowtrial-key`` (Claude
Code's ``ANTHROPIC_CUSTOM_HEADERS``) or by the ``/p/<key>/`` path prefix (clients that can
only set a base URL). Traffic comes from the official SDKs. Checked: each credential went
upstream with its own requests only, no flowtrial key went upstream, a request without a
flowtrial identity is refused before anything is forwarded, and neither kind of secret is
in the database files, the proxy's output or any export.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pandas as pd
import pytest
from google import genai
from google.genai import types
from typer.testing import CliRunner
from websockets.sync.client import connect as ws_connect

from flowtrial.cli import app as cli
from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.app import create_mock_app
from flowtrial.study.config import load_study
from flowtrial.study.keys import split_key
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db
from tests.instrumentation.servers import run_asgi_server
from tests.security.test_secrets import ROOT, Proxy, _assert_absent, _files_text

MODEL = "flowtrial-sim-1"
STUDY = """
[study]
name = "passthrough-test"
design = "parallel"

[[arms]]
name = "team"

[upstream]
timeout_s = 20

[upstream.openai]
base_url = "{up}/v1"
credentials = "participant"

[upstream.anthropic]
base_url = "{up}"
credentials = "participant"

[upstream.gemini]
base_url = "{up}"
credentials = "participant"

[capture]
content = "full"
"""
_CREDENTIAL = ("authorization", "x-api-key", "x-goog-api-key")


class OwnCredentialGate:
    """ASGI: answers only requests carrying one of ``allowed`` (as a bearer token, an
    ``x-api-key`` or an ``x-goog-api-key``); records every request's path and headers."""

    def __init__(self, inner: Any, allowed: set[str]) -> None:
        self.inner = inner
        self.allowed = allowed
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.inner(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.seen.append({"path": scope["path"], **headers})
        given = {headers.get(h, "").removeprefix("Bearer ") for h in _CREDENTIAL}
        if given & self.allowed:
            await self.inner(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body",
                    "body": b'{"error": {"message": "bad credential", "type": "auth"}}'})


@pytest.fixture
def own() -> dict[str, str]:
    """The participants' own provider credentials."""
    return {"alice openai": "sk-alice-" + secrets.token_urlsafe(24),
            "bob oauth": "sk-ant-oat01-" + secrets.token_urlsafe(24),
            "alice gemini": "AIza" + secrets.token_urlsafe(24)}


@pytest.fixture
def gate(own: dict[str, str]) -> Iterator[tuple[OwnCredentialGate, str]]:
    g = OwnCredentialGate(create_mock_app(MockModel(tokens_per_second=1e6, ttft_ms=0)),
                          set(own.values()))
    with run_asgi_server(g) as url:
        yield g, url


def test_own_credentials_pass_through_and_are_kept_nowhere(
        tmp_path: Path, gate: Any, own: dict[str, str]) -> None:
    g, upstream_url = gate
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(up=upstream_url), encoding="utf-8")
    db = tmp_path / "study.db"
    config = load_study(study)
    database = init_db(db, config, study.read_text(encoding="utf-8"))
    keys = {pid: enroll(database, config, pid)[1] for pid in ("alice", "bob")}
    database.dispose()
    secrets_ = dict(own)
    for pid, k in keys.items():
        secrets_[f"{pid}'s key"] = k
        secrets_[f"{pid}'s key secret"] = split_key(k)[1]  # type: ignore[index]

    proxy = Proxy(study, db, {**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = proxy.wait_ready()
        refused = _refusals(url, keys, own, g)
        _traffic(url, keys, own)
        blobs = _files_text(sorted(p for p in tmp_path.iterdir()
                                   if p.name.startswith("study.db")))
        _assert_absent(secrets_, blobs, "the live database files")
    finally:
        logs = proxy.stop()
    assert proxy.proc.returncode == 0, logs[-2000:]
    _assert_absent(secrets_, {"proxy stdout+stderr": logs.encode()}, "the proxy's output")

    # Each credential reached the upstream on its own participant's requests; no flowtrial
    # key ever did, and the refused requests sent nothing.
    assert refused == 0
    by_cred = {name: [r["path"] for r in g.seen if cred in " ".join(r.values())]
               for name, cred in own.items()}
    assert by_cred["alice openai"] and all(p.startswith("/v1/") for p in by_cred["alice openai"])
    assert by_cred["bob oauth"] and all(p.startswith("/v1/messages")
                                        for p in by_cred["bob oauth"])
    assert by_cred["alice gemini"] and all(p.startswith("/v1beta/")
                                           for p in by_cred["alice gemini"])
    assert len(g.seen) == sum(len(v) for v in by_cred.values())
    for req in g.seen:
        assert "x-flowtrial-key" not in req  # (x-flowtrial-cycle-id goes up: the cycle's id)
        for k in keys.values():
            assert split_key(k)[1] not in " ".join(req.values())  # type: ignore[operator]

    exported: list[Path] = []
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"export-{fmt}"
        r = CliRunner().invoke(cli, ["export", "--db", str(db), "--out", str(out),
                                     "--format", fmt])
        assert r.exit_code == 0, r.output
        exported += sorted(out.iterdir())
    rest = sorted(p for p in tmp_path.iterdir() if p.name.startswith("study.db"))
    _assert_absent(secrets_, _files_text(rest + exported), "the database files and exports")
    cycles = pd.read_csv(tmp_path / "export-csv" / "cycles.csv")
    assert set(cycles["participant_id"]) == {"alice", "bob"}
    assert set(cycles["protocol"]) == {"chat", "responses", "messages", "gemini"}
    assert (cycles["status"] == "ok").all() and len(cycles) == 5  # count_tokens: no cycle
    assert "websocket" in set(cycles["transport"])


def _refusals(url: str, keys: dict[str, str], own: dict[str, str],
              g: OwnCredentialGate) -> int:
    """Requests without a flowtrial identity apart from their credential: refused (401,
    the protocol's shape) before anything is forwarded. Returns what the upstream saw."""
    before = len(g.seen)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=url, timeout=30) as c:
        # Only the own credential: who is this?
        r = c.post("/v1/chat/completions", json=chat,
                   headers={"authorization": f"Bearer {own['alice openai']}"})
        assert r.status_code == 401 and own["alice openai"] not in r.text
        # Only the flowtrial key, as the credential: it would be forwarded to the provider.
        r = c.post("/v1/messages", json={**chat, "max_tokens": 8},
                   headers={"x-api-key": keys["bob"]})
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert "x-flowtrial-key" in r.json()["error"]["message"]
        # A wrong flowtrial key in the path.
        r = c.post("/p/ft_wrong_key/v1/chat/completions", json=chat,
                   headers={"authorization": f"Bearer {own['alice openai']}"})
        assert r.status_code == 401
    return len(g.seen) - before


def _traffic(url: str, keys: dict[str, str], own: dict[str, str]) -> None:
    a, b = keys["alice"], keys["bob"]
    # Alice's OpenAI client can only set a base URL: her key is in its path.
    oa = openai.OpenAI(base_url=f"{url}/p/{a}/v1", api_key=own["alice openai"], max_retries=0)
    r = oa.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "def add(a, b):"}], max_tokens=12)
    assert r.choices[0].message.content
    assert list(oa.responses.create(model=MODEL, input="write a loop", stream=True,
                                    max_output_tokens=16))
    # The Responses WebSocket mode (Codex), identified by the path too.
    ws_url = url.replace("http://", "ws://") + f"/p/{a}/v1/responses"
    with ws_connect(ws_url, additional_headers={
            "authorization": f"Bearer {own['alice openai']}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hello",
                            "max_output_tokens": 8}))
        while json.loads(ws.recv(timeout=20))["type"] not in ("response.completed",
                                                              "response.incomplete"):
            pass
    # Bob's Claude Code on a subscription: an OAuth bearer token, his key in a header.
    an = anthropic.Anthropic(base_url=url, auth_token=own["bob oauth"], max_retries=0,
                             default_headers={"x-flowtrial-key": b})
    msg = an.messages.create(model=MODEL, max_tokens=12,
                             messages=[{"role": "user", "content": "sort a list"}])
    assert msg.content[0].text
    assert an.messages.count_tokens(model=MODEL, messages=[
        {"role": "user", "content": "sort a list"}]).input_tokens > 0
    # Alice's Gemini client: her Gemini key, her flowtrial key in a header.
    gc = genai.Client(api_key=own["alice gemini"], http_options=types.HttpOptions(
        base_url=url, api_version="v1beta", headers={"x-flowtrial-key": a}))
    assert "".join(ch.text or "" for ch in gc.models.generate_content_stream(
        model=MODEL, contents="reverse a list"))
