"""The real agents through `flowtrial proxy` (the CLI, as users run it) with shaping on: each
completes its turn, prints the simulated model's answer, and every model request it made is
a recorded cycle whose latency target was met.

The generic tests in test_agents_mock.py also run through the proxy (SERVERS["proxy"]);
these check what only a proxy can show: the cycles in the study database.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import KEY_ENV, MODEL, claude_env
from tests.agents.harness import TARGET_TTFT_MS, AgentServer, flowtrial_proxy, run_agent
from tests.agents.recording import OutboundTrap
from tests.agents.test_agents_mock import PROMPT, _codex_command

_COLUMNS = ("protocol, transport, turn, connection_id, stream, status, http_status, shaped, "
            "target_ttft_ms, experienced_ttft_ms, violation, violation_ms, content_text, "
            "prompt_text, tokens_sent, usage_exact, participant_id")


def _explain(result: subprocess.CompletedProcess[str], rows: list[Any]) -> str:
    cycles = "\n".join(str({k: r[k] for k in r.keys() if k != "content_text"}) for r in rows)
    return (f"exit {result.returncode}\n--- cycles\n{cycles or '(none)'}\n"
            f"--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-2000:]}")


#: How late a token may be here. The instrument flags a violation above 5 ms; these tests run
#: the proxy next to a CPU-hungry Node agent (and the test's own work) on a shared CI machine,
#: where an occasional 5-10 ms scheduling stall of the proxy's process is the machine, not a
#: missed target. The TTFT floor itself is exact (the proxy never releases early).
LOADED_MACHINE_TOLERANCE_MS = 50.0


def _assert_on_target(rows: list[Any], protocol: str) -> None:
    """Every cycle: this protocol, answered, shaped, the TTFT floor met, on schedule."""
    for r in rows:
        assert r["protocol"] == protocol and r["participant_id"] == "p01"
        assert r["status"] == "ok" and r["shaped"] and r["target_ttft_ms"] == TARGET_TTFT_MS
        assert r["experienced_ttft_ms"] >= TARGET_TTFT_MS
        assert r["violation_ms"] is not None
        assert r["violation_ms"] <= LOADED_MACHINE_TOLERANCE_MS, (
            f"target missed by {r['violation_ms']:.1f} ms")
        assert r["tokens_sent"] > 0 and r["usage_exact"]


@pytest.fixture
def proxy_cli(tmp_path: Path) -> Any:
    """`flowtrial proxy` (the CLI in a subprocess) on PROXY_STUDY: (base URL, key, query)."""
    with flowtrial_proxy(tmp_path) as served:
        yield served


def _codex(codex_bin: Path, workdir: Path, agent_env: dict[str, str],
           codex_home: Callable[..., Path], url: str, key: str, websockets: bool
           ) -> subprocess.CompletedProcess[str]:
    home = codex_home(url + "/v1", websockets=websockets)
    env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: key}
    return run_agent(_codex_command(codex_bin, workdir), env, workdir)


def test_codex_over_sse_through_flowtrial_proxy(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        codex_home: Callable[..., Path], proxy_cli: Any, outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_cli
    result = _codex(codex_bin, workdir, agent_env, codex_home, url, key, websockets=False)
    rows = query(f"SELECT {_COLUMNS} FROM cycles ORDER BY t_request_ns")
    assert result.returncode == 0, _explain(result, rows)
    assert rows, _explain(result, rows)
    _assert_on_target(rows, "responses")
    assert all(r["transport"] == "http" and r["turn"] == 1 and r["connection_id"] is None
               and r["stream"] for r in rows)
    answer = rows[-1]["content_text"].strip()
    assert answer and answer in result.stdout, _explain(result, rows)
    assert PROMPT in rows[0]["prompt_text"]
    assert outbound_trap.attempts == []


def test_codex_over_websocket_through_flowtrial_proxy(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        codex_home: Callable[..., Path], proxy_cli: Any, outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_cli
    result = _codex(codex_bin, workdir, agent_env, codex_home, url, key, websockets=True)
    rows = query(f"SELECT {_COLUMNS} FROM cycles ORDER BY t_request_ns")
    assert result.returncode == 0, _explain(result, rows)
    assert rows, _explain(result, rows)
    _assert_on_target(rows, "responses")
    # Only generating turns are cycles (the generate:false warm-up is not), numbered from 1
    # per connection; no request fell back to HTTP.
    assert all(r["transport"] == "websocket" and r["connection_id"] for r in rows)
    by_conn: dict[str, list[int]] = {}
    for r in rows:
        by_conn.setdefault(r["connection_id"], []).append(r["turn"])
    assert all(turns == list(range(1, len(turns) + 1)) for turns in by_conn.values())
    answer = rows[-1]["content_text"].strip()
    assert answer and answer in result.stdout, _explain(result, rows)
    assert outbound_trap.attempts == []


def test_claude_code_through_flowtrial_proxy(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], proxy_cli: Any,
        outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_cli
    env = agent_env | claude_env(url, key)
    command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence"]
    result = run_agent(command, env, workdir)
    rows = query(f"SELECT {_COLUMNS} FROM cycles ORDER BY t_request_ns")
    assert result.returncode == 0, _explain(result, rows)
    assert rows, _explain(result, rows)
    # Every request Claude Code made to /v1/messages is a cycle, answered and on target.
    _assert_on_target(rows, "messages")
    assert all(r["transport"] == "http" and r["http_status"] == 200 for r in rows)
    turn = next(r for r in rows if PROMPT in (r["prompt_text"] or ""))
    answer = turn["content_text"].strip()
    assert answer and answer in result.stdout, _explain(result, rows)
    assert outbound_trap.attempts == []


def test_agent_server_proxy_records_what_the_agents_saw(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        codex_home: Callable[..., Path], outbound_trap: OutboundTrap) -> None:
    """The in-process SERVERS["proxy"]: the frames Codex received over its WebSocket are the
    cycle's recorded answer (content and response id), turn by turn."""
    from tests.agents.harness import SERVERS

    with SERVERS["proxy"]() as server:
        assert isinstance(server, AgentServer) and server.rows is not None
        result = _codex(codex_bin, workdir, agent_env, codex_home, server.base_url,
                        server.key, websockets=True)
        assert result.returncode == 0, server.log.summary()
        rows = server.rows("SELECT upstream_response_id, content_text FROM cycles "
                           "ORDER BY t_request_ns")
        sockets = server.log.websockets()
    completed = [json.loads(f)["response"]["id"] for s in sockets for f in s.sent
                 if json.loads(f).get("type") == "response.completed"]
    # The warm-up's response completes too but is not a cycle.
    assert [r["upstream_response_id"] for r in rows] == completed[-len(rows):]
    assert rows[-1]["content_text"] == "".join(s.answer for s in sockets)
