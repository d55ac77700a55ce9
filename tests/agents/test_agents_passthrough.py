"""The real agents on their participants' own credentials (``credentials = "participant"``)
through `flowtrial proxy`: each sends its own provider credential, which must reach an
upstream that accepts nothing else, and identifies the person apart from it with the
``x-flowtrial-key`` header its own settings can add (Claude Code's
``ANTHROPIC_CUSTOM_HEADERS`` with a bearer token as ``ANTHROPIC_AUTH_TOKEN``, Codex's
provider ``env_http_headers``, the Gemini CLI's ``GEMINI_CLI_CUSTOM_HEADERS``) — or, for the
Gemini CLI, the ``/p/<key>`` base URL. The recipes in docs/operators/credentials.md.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.app import create_mock_app
from flowtrial.study.config import load_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db
from tests.agents.agent_configs import (
    KEY_ENV,
    MODEL,
    claude_env,
    codex_config,
    gemini_env,
    gemini_settings,
    to_toml,
)
from tests.agents.harness import ROOT, run_agent
from tests.agents.recording import OutboundTrap
from tests.agents.test_agents_mock import PROMPT
from tests.instrumentation.servers import run_asgi_server
from tests.security.test_passthrough import STUDY, OwnCredentialGate
from tests.security.test_secrets import Proxy

OWN = "sk-own-" + secrets.token_urlsafe(24)  # the participant's own provider credential
OWN_ENV = "OWN_PROVIDER_KEY"


@pytest.fixture
def passthrough(tmp_path: Path) -> Iterator[tuple[str, str, OwnCredentialGate, Any]]:
    """`flowtrial proxy` forwarding participants' own credentials to a gate over the
    simulated model: (proxy URL, flowtrial key, gate, SQL runner)."""
    gate = OwnCredentialGate(create_mock_app(MockModel(tokens_per_second=1e6, ttft_ms=0)),
                             {OWN})
    with run_asgi_server(gate) as upstream:
        study = tmp_path / "study.toml"
        study.write_text(STUDY.format(up=upstream), encoding="utf-8")
        db = tmp_path / "study.db"
        config = load_study(study)
        database = init_db(db, config, study.read_text(encoding="utf-8"))
        key = enroll(database, config, "p01")[1]
        proxy = Proxy(study, db, {**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            url = proxy.wait_ready()

            def rows(sql: str) -> list[Any]:
                with database.engine.connect() as conn:
                    return [r._mapping for r in conn.exec_driver_sql(sql)]

            yield url, key, gate, rows
        finally:
            logs = proxy.stop()
            database.dispose()
        assert OWN not in logs and key not in logs


def _check(result: Any, gate: OwnCredentialGate, rows: Any, protocol: str) -> None:
    why = f"exit {result.returncode}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
    assert result.returncode == 0, why
    assert gate.seen and all(OWN in " ".join(r.values()) for r in gate.seen), why
    assert all("x-flowtrial-key" not in r for r in gate.seen)
    cycles = rows("SELECT protocol, status, participant_id FROM cycles")
    assert cycles and {(c["protocol"], c["status"], c["participant_id"]) for c in cycles} == {
        (protocol, "ok", "p01")}, why


@pytest.mark.parametrize("token_var", ["ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"])
def test_claude_code_bearer_token_passes_through(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], passthrough: Any,
        outbound_trap: OutboundTrap, token_var: str) -> None:
    """A bearer token (``ANTHROPIC_AUTH_TOKEN``) and a subscription's OAuth token
    (``CLAUDE_CODE_OAUTH_TOKEN``, what ``claude setup-token`` gives) both reach the upstream
    as ``Authorization: Bearer``."""
    url, key, gate, rows = passthrough
    env = agent_env | claude_env(url, key)
    del env["ANTHROPIC_API_KEY"]  # the person's own token instead, as a bearer token
    env |= {token_var: OWN, "ANTHROPIC_CUSTOM_HEADERS": f"x-flowtrial-key: {key}"}
    result = run_agent([claude_bin, "-p", PROMPT, "--model", MODEL,
                        "--no-session-persistence"], env, workdir)
    _check(result, gate, rows, "messages")
    assert all(r.get("authorization") == f"Bearer {OWN}" for r in gate.seen)
    assert outbound_trap.attempts == []


def test_codex_own_key_passes_through(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str], passthrough: Any,
        outbound_trap: OutboundTrap, tmp_path: Path) -> None:
    url, key, gate, rows = passthrough
    config = codex_config(url + "/v1", env_key=OWN_ENV)
    config["model_providers"]["flowtrial"]["env_http_headers"] = {"x-flowtrial-key": KEY_ENV}
    home = tmp_path / "codex_home"
    home.mkdir()
    (home / "config.toml").write_text(to_toml(config), encoding="utf-8")
    env = agent_env | {"CODEX_HOME": str(home), OWN_ENV: OWN, KEY_ENV: key}
    result = run_agent([codex_bin, "exec", "--skip-git-repo-check", "--ephemeral", "--color",
                        "never", "-C", workdir, PROMPT], env, workdir)
    _check(result, gate, rows, "responses")
    assert outbound_trap.attempts == []


@pytest.mark.parametrize("identity", ["header", "path"])
def test_gemini_cli_own_key_passes_through(
        gemini_bin: Path, workdir: Path, agent_env: dict[str, str], passthrough: Any,
        outbound_trap: OutboundTrap, identity: str) -> None:
    url, key, gate, rows = passthrough
    settings = Path(agent_env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps(gemini_settings()), encoding="utf-8")
    if identity == "header":
        env = agent_env | gemini_env(url, OWN) | {
            "GEMINI_CLI_CUSTOM_HEADERS": f"x-flowtrial-key:{key}"}
    else:
        env = agent_env | gemini_env(f"{url}/p/{key}", OWN)
    result = run_agent([gemini_bin, "-p", PROMPT, "-m", MODEL], env, workdir)
    _check(result, gate, rows, "gemini")
    assert all(r.get("x-goog-api-key") == OWN for r in gate.seen)
    assert outbound_trap.attempts == []
