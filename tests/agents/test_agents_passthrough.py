"""The real agents on their participants' own credentials (``credentials = "participant"``)
through `flowtrial proxy`: each sends its own provider credential, which must reach an
upstream that accepts nothing else, and identifies the person apart from it with the
``x-flowtrial-key`` header its own settings can add (Claude Code's
``ANTHROPIC_CUSTOM_HEADERS`` with a bearer token as ``ANTHROPIC_AUTH_TOKEN``, Codex's
provider ``env_http_headers``, the Gemini CLI's ``GEMINI_CLI_CUSTOM_HEADERS``) — or, for the
Gemini CLI, the ``/p/<key>`` base URL. The recipes in docs/operators/credentials.md.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

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


def test_claude_code_login_session_passes_through(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], passthrough: Any,
        outbound_trap: OutboundTrap) -> None:
    """A ``/login`` session as Claude Code stores it on Linux (``~/.claude/.credentials.json``,
    ``claudeAiOauth``; on macOS the same object is in the keychain): its OAuth access token
    reaches the upstream as ``Authorization: Bearer``, with no token variable set."""
    url, key, gate, rows = passthrough
    folder = Path(agent_env["HOME"]) / ".claude"
    folder.mkdir()
    (folder / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {
        "accessToken": OWN, "refreshToken": "rt-flowtrial-fake",
        "expiresAt": int(time.time() + 30 * 86400) * 1000,
        "scopes": ["user:inference", "user:profile"], "subscriptionType": "pro"}}),
        encoding="utf-8")
    env = agent_env | claude_env(url, key)
    del env["ANTHROPIC_API_KEY"]
    env["ANTHROPIC_CUSTOM_HEADERS"] = f"x-flowtrial-key: {key}"
    result = run_agent([claude_bin, "-p", PROMPT, "--model", MODEL,
                        "--no-session-persistence"], env, workdir)
    _check(result, gate, rows, "messages")
    assert all(r.get("authorization") == f"Bearer {OWN}" for r in gate.seen)
    # Unlike a token in a variable, a stored session makes Claude Code contact
    # api.anthropic.com itself beside the model calls (the trap sees only CONNECT, not what).
    assert {a.split()[1] for a in outbound_trap.attempts} <= {"api.anthropic.com:443"}


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


def _chatgpt_sign_in(codex_home: Path) -> tuple[str, str]:
    """A ChatGPT sign-in as ``codex login`` stores it (``auth.json``: fake, unsigned JWTs that
    expire in a month, refreshed just now): (access token, account id)."""
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    exp = int(time.time()) + 30 * 86400
    claims = {"https://api.openai.com/auth": {"chatgpt_plan_type": "pro",
                                              "chatgpt_account_id": "acct-flowtrial",
                                              "chatgpt_user_id": "user-flowtrial"}}
    head = part({"alg": "RS256", "typ": "JWT"})
    access = f"{head}.{part({'exp': exp, **claims})}.c2ln"
    id_token = f"{head}.{part({'email': 'p01@example.org', 'exp': exp, **claims})}.c2ln"
    (codex_home / "auth.json").write_text(json.dumps({
        "OPENAI_API_KEY": None,
        "tokens": {"id_token": id_token, "access_token": access, "refresh_token": "rt-fake",
                   "account_id": "acct-flowtrial"},
        "last_refresh": datetime.now(UTC).isoformat().replace("+00:00", "Z")}),
        encoding="utf-8")
    return access, "acct-flowtrial"


class ChatgptRun(NamedTuple):
    """What one ``codex exec`` signed in with ChatGPT through the proxy left behind."""

    result: Any  # run_agent's result
    seen: list[dict[str, str]]  # the requests the upstream got (their headers and path)
    access: str
    account: str
    key: str  # the participant's flowtrial key
    logs: str  # the proxy's output


def _codex_on_chatgpt(codex_bin: Path, workdir: Path, agent_env: dict[str, str],
                      tmp_path: Path, provider: dict[str, Any],
                      features: dict[str, Any] | None = None) -> ChatgptRun:
    """Run Codex signed in with ChatGPT through a proxy whose OpenAI upstream takes only
    that sign-in's token; ``provider`` is added to the recipe's provider (which loses its
    ``env_key``) and ``features`` to its ``[features]``."""
    home = tmp_path / "codex_home"
    home.mkdir()
    access, account = _chatgpt_sign_in(home)
    gate = OwnCredentialGate(create_mock_app(MockModel(tokens_per_second=1e6, ttft_ms=0)),
                             {access})
    with run_asgi_server(gate) as upstream:
        study = tmp_path / "study.toml"
        study.write_text(STUDY.format(up=upstream), encoding="utf-8")
        db = tmp_path / "study.db"
        config = load_study(study)
        database = init_db(db, config, study.read_text(encoding="utf-8"))
        key = enroll(database, config, "p01")[1]
        database.dispose()
        proxy = Proxy(study, db, {**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            url = proxy.wait_ready()
            codex = codex_config(url + "/v1")
            own = codex["model_providers"]["flowtrial"]
            del own["env_key"]
            own |= {"requires_openai_auth": True, "http_headers": {"x-flowtrial-key": key},
                    **provider}
            codex["features"] |= features or {}
            (home / "config.toml").write_text(to_toml(codex), encoding="utf-8")
            result = run_agent([codex_bin, "exec", "--skip-git-repo-check", "--ephemeral",
                                "--color", "never", "-C", workdir, PROMPT],
                               agent_env | {"CODEX_HOME": str(home)}, workdir)
        finally:
            logs = proxy.stop()
    return ChatgptRun(result, gate.seen, access, account, key, logs)


def test_codex_chatgpt_sign_in_passes_through(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    """Codex signed in with ChatGPT: a custom provider with ``requires_openai_auth = true``
    sends the ChatGPT access token (and ``chatgpt-account-id``) to the proxy, which forwards
    them; Codex still contacts chatgpt.com on its own beside the model calls."""
    run = _codex_on_chatgpt(codex_bin, workdir, agent_env, tmp_path, {})
    assert run.result.returncode == 0, run.result.stderr[-2000:]
    calls = [r for r in run.seen if r["path"] == "/v1/responses"]
    assert calls and all(r.get("authorization") == f"Bearer {run.access}"
                         and r.get("chatgpt-account-id") == run.account for r in calls)
    assert run.access not in run.logs and run.key not in run.logs
    # What Codex sends beside the model calls on a ChatGPT sign-in goes to chatgpt.com.
    assert {a.split()[1] for a in outbound_trap.attempts} <= {"chatgpt.com:443"}


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


@pytest.mark.parametrize("compression", [True, False], ids=["compressing", "recipe"])
def test_codex_chatgpt_sign_in_compression_is_refused_by_name_and_turned_off_by_the_recipe(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap, compression: bool) -> None:
    """Signed in with ChatGPT through a provider Codex takes for OpenAI's own (named
    "OpenAI"), Codex compresses its requests with zstd unless the recipe's
    ``enable_request_compression = false`` is kept: the proxy answers 415 naming that
    setting (Codex shows it), and with the recipe the turn is served."""
    run = _codex_on_chatgpt(codex_bin, workdir, agent_env, tmp_path, {"name": "OpenAI"},
                            {"enable_request_compression": compression})
    result = run.result
    calls = [r for r in run.seen if r["path"] == "/v1/responses"]
    if compression:
        assert result.returncode != 0 and not calls
        assert "enable_request_compression" in result.stdout + result.stderr
    else:
        assert result.returncode == 0, result.stderr[-2000:]
        assert calls
