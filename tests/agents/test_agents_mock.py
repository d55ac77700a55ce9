"""The real Codex CLI and Claude Code complete a turn against flowtrial, offline.

Each test runs the pinned agent non-interactively with a throwaway key, checks that it exits
0 and prints the answer the server sent, that its requests used the expected protocol, and
that it tried to reach nothing but the server (the outbound trap stayed empty).
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agents.agent_configs import KEY_ENV, MODEL, claude_env, codex_config, to_toml
from tests.agents.harness import AgentServer, run_agent
from tests.agents.recording import OutboundTrap, RecordedRequest, RequestLog

PROMPT = "Write a Python function that reverses a string."


def _codex_command(codex_bin: Path, workdir: Path) -> list[str | Path]:
    return [codex_bin, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never",
            "-C", workdir, PROMPT]


def _explain(result: subprocess.CompletedProcess[str], log: RequestLog) -> str:
    """What a failure message needs: exit code, requests seen, the ends of both outputs."""
    return (f"exit {result.returncode}\n--- requests\n{log.summary()}\n"
            f"--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-2000:]}")


def _codex_env(agent_env: dict[str, str], home: Path, server: AgentServer) -> dict[str, str]:
    return agent_env | {"CODEX_HOME": str(home), KEY_ENV: server.key}


def _assert_codex_turn_body(body: dict[str, Any]) -> None:
    """What Codex puts in every turn, over SSE or WebSocket alike."""
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert {"input", "tools", "tool_choice", "reasoning", "store", "include"} <= set(body)
    assert body["store"] is False and "reasoning.encrypted_content" in body["include"]
    assert any(t.get("name") == "exec_command" for t in body["tools"])  # the shell tool
    texts = [c.get("text", "") for item in body["input"] if isinstance(item, dict)
             for c in item.get("content") or [] if isinstance(c, dict)]
    assert any(PROMPT in t for t in texts)


def test_codex_exec_over_sse(codex_bin: Path, agent_server: AgentServer, workdir: Path,
                             agent_env: dict[str, str], codex_home: Callable[..., Path],
                             outbound_trap: OutboundTrap) -> None:
    home = codex_home(agent_server.openai_base_url, websockets=False)
    result = run_agent(_codex_command(codex_bin, workdir),
                       _codex_env(agent_env, home, agent_server), workdir)
    log = agent_server.log
    assert result.returncode == 0, _explain(result, log)

    assert log.websockets() == [], _explain(result, log)
    turns = [r for r in log.http("/v1/responses") if r.method == "POST"]
    assert turns and all(r.status == 200 for r in turns), _explain(result, log)
    first = turns[0]
    assert first.headers["authorization"] == f"Bearer {agent_server.key}"
    assert first.headers["accept"] == "text/event-stream"
    assert first.headers["originator"] == "codex_exec"
    _assert_codex_turn_body(first.json)

    answer = turns[-1].answer.strip()
    assert answer and answer in result.stdout, _explain(result, log)
    assert outbound_trap.attempts == []


def test_codex_exec_over_websocket(codex_bin: Path, agent_server: AgentServer, workdir: Path,
                                   agent_env: dict[str, str], codex_home: Callable[..., Path],
                                   outbound_trap: OutboundTrap) -> None:
    home = codex_home(agent_server.openai_base_url, websockets=True)
    result = run_agent(_codex_command(codex_bin, workdir),
                       _codex_env(agent_env, home, agent_server), workdir)
    log = agent_server.log
    assert result.returncode == 0, _explain(result, log)

    assert [r for r in log.http("/v1/responses") if r.method == "POST"] == [], \
        "Codex fell back to HTTP:\n" + _explain(result, log)
    sockets = log.websockets()
    assert sockets and all(s.path == "/v1/responses" and s.status == 101 for s in sockets)
    socket = sockets[0]
    assert socket.headers["authorization"] == f"Bearer {agent_server.key}"
    assert "responses_websockets" in socket.headers.get("openai-beta", "")
    frames = [f for s in sockets for f in s.messages]
    assert frames and all(f["type"] == "response.create" for f in frames)
    generating = [f for f in frames if f.get("generate", True)]
    assert generating, "no response.create asked for output"
    _assert_codex_turn_body(generating[-1])
    _assert_chained_to_earlier_responses(socket)

    answer = "".join(s.answer for s in sockets).strip()
    assert answer and answer in result.stdout, _explain(result, log)
    assert outbound_trap.attempts == []


def _assert_chained_to_earlier_responses(socket: RecordedRequest) -> None:
    """A `previous_response_id` on the socket names a response sent earlier on it."""
    sent_ids = [event["response"]["id"] for event in map(json.loads, socket.sent)
                if event.get("type") == "response.created"]
    for frame in socket.messages:
        previous = frame.get("previous_response_id")
        if previous is not None:
            assert previous in sent_ids


def test_codex_falls_back_to_sse_when_websocket_is_refused(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        codex_home: Callable[..., Path], outbound_trap: OutboundTrap) -> None:
    """A server without the WebSocket mode (e.g. the proxy before it gains one) still works
    with `supports_websockets = true`: Codex retries the handshake, then uses SSE."""
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app
    from tests.instrumentation.servers import run_asgi_server

    inner = create_mock_app(MockModel(tokens_per_second=math.inf, ttft_ms=5))

    async def no_websockets(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        await inner(scope, receive, send)

    log = RequestLog(no_websockets)
    with run_asgi_server(log) as base_url:
        home = codex_home(base_url + "/v1", websockets=True)
        env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: "ft_agenttest_not-a-real-key"}
        result = run_agent(_codex_command(codex_bin, workdir), env, workdir)
    assert result.returncode == 0, _explain(result, log)
    assert log.websockets() and all(s.status == 403 for s in log.websockets())
    turns = [r for r in log.http("/v1/responses") if r.method == "POST"]
    assert turns and turns[-1].answer.strip() in result.stdout, _explain(result, log)
    assert outbound_trap.attempts == []


def test_claude_code_print_mode(claude_bin: Path, agent_server: AgentServer, workdir: Path,
                                agent_env: dict[str, str],
                                outbound_trap: OutboundTrap) -> None:
    env = agent_env | claude_env(agent_server.base_url, agent_server.key)
    command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence"]
    result = run_agent(command, env, workdir)
    log = agent_server.log
    assert result.returncode == 0, _explain(result, log)

    calls = [r for r in log.http("/v1/messages") if r.method == "POST"]
    assert calls and all(r.status == 200 for r in calls), _explain(result, log)
    turn = next(r for r in calls if r.json.get("tools"))  # the agent turn, tools attached
    assert turn.query == "beta=true"
    assert turn.headers["x-api-key"] == agent_server.key
    assert turn.headers["anthropic-version"] == "2023-06-01"
    assert "claude-code" in turn.headers.get("anthropic-beta", "")
    body = turn.json
    assert body["model"] == MODEL and body["stream"] is True and body["max_tokens"] >= 1
    assert any(t.get("name") == "Bash" for t in body["tools"])
    assert PROMPT in str(body["messages"])

    answer = turn.answer.strip()
    assert answer and answer in result.stdout, _explain(result, log)
    assert outbound_trap.attempts == []


def test_codex_without_the_offline_settings_is_contained(
        codex_bin: Path, agent_server: AgentServer, workdir: Path, agent_env: dict[str, str],
        tmp_path: Path, outbound_trap: OutboundTrap) -> None:
    """Why codex_config turns off analytics and plugins: otherwise Codex contacts OpenAI and
    GitHub hosts too; the trap refuses at once, and the turn still completes."""
    config = codex_config(agent_server.openai_base_url)
    del config["analytics"], config["features"]
    home = tmp_path / "codex_home_online"
    home.mkdir()
    (home / "config.toml").write_text(to_toml(config))
    result = run_agent(_codex_command(codex_bin, workdir),
                       _codex_env(agent_env, home, agent_server), workdir)
    assert result.returncode == 0, _explain(result, agent_server.log)
    hosts = " ".join(outbound_trap.attempts)
    assert "chatgpt.com" in hosts and "github.com" in hosts, outbound_trap.attempts


def test_claude_code_without_the_traffic_switch_is_contained(
        claude_bin: Path, agent_server: AgentServer, workdir: Path,
        agent_env: dict[str, str], outbound_trap: OutboundTrap) -> None:
    """Why claude_env sets CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: without it Claude Code
    calls api.anthropic.com too; the trap refuses at once, and the turn still completes."""
    env = agent_env | claude_env(agent_server.base_url, agent_server.key)
    for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY",
                 "DISABLE_ERROR_REPORTING", "DISABLE_AUTOUPDATER"):
        env.pop(name)
    result = run_agent([claude_bin, "-p", PROMPT, "--model", MODEL], env, workdir)
    assert result.returncode == 0, _explain(result, agent_server.log)
    assert any("api.anthropic.com" in line for line in outbound_trap.attempts)
