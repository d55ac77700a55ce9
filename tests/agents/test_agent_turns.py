"""A real agent's multi-step turn through `flowtrial proxy` is one turn in the database.

The simulated model runs with `[upstream] tool_steps = 3`: the agent's first three model
calls of the turn are answered with a harmless tool call (Codex: `exec_command` running
`pwd`; Claude Code: `Bash` running `pwd`, allowed on the command line), which the agent runs
before it asks again with the result, and the fourth with the text answer. The database then
holds one `human` turn containing all of the agent's calls of that turn, with tool time.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import KEY_ENV, MODEL, claude_env
from tests.agents.harness import flowtrial_proxy, run_agent
from tests.agents.recording import OutboundTrap

TOOL_STEPS = 3
PROMPT = "Which folder are we in? Check, then answer."
_CYCLES = ("id, request_kind, kind_rule, turn_id, client, tool_calls, status, prompt_text, "
           "content_text")
_TURNS = ("id, model_calls, side_calls, retries, tool_calls, wait_ms, model_ms, injected_ms, "
          "tool_ms, gap_ms, status, first_cycle_id, last_cycle_id, client, protocol")


@pytest.fixture
def proxy_with_tools(tmp_path: Path) -> Any:
    folder = tmp_path / "study"
    folder.mkdir()
    with flowtrial_proxy(folder, tool_steps=TOOL_STEPS) as served:
        yield served


def _explain(result: subprocess.CompletedProcess[str], query: Callable[[str], list[Any]]
             ) -> str:
    cycles = "\n".join(str({k: r[k] for k in r.keys() if k not in ("prompt_text",
                                                                     "content_text")})
                       for r in query(f"SELECT {_CYCLES} FROM cycles ORDER BY t_request_ns"))
    turns = "\n".join(str(dict(r)) for r in query(f"SELECT {_TURNS} FROM turns"))
    return (f"exit {result.returncode}\n--- cycles\n{cycles or '(none)'}\n--- turns\n"
            f"{turns or '(none)'}\n--- stdout\n{result.stdout[-2000:]}\n--- stderr\n"
            f"{result.stderr[-2000:]}")


def _wait_for_turn(query: Callable[[str], list[Any]], turn_id: str, calls: int) -> Any:
    """The turn's row once it counts ``calls`` model calls (the proxy writes it after the
    last cycle, without holding the answer for it)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        rows = query(f"SELECT {_TURNS} FROM turns WHERE id = '{turn_id}'")
        if (rows and rows[0]["model_calls"] >= calls) or time.monotonic() > deadline:
            return rows[0] if rows else None
        time.sleep(0.1)


def _assert_one_agent_turn(result: subprocess.CompletedProcess[str],
                           query: Callable[[str], list[Any]], client: str) -> Any:
    why = _explain(result, query)
    assert result.returncode == 0, why
    cycles = query(f"SELECT {_CYCLES} FROM cycles ORDER BY t_request_ns")
    main = [c for c in cycles if c["request_kind"] != "side"]
    human = [c for c in main if c["request_kind"] == "human"]
    # One prompt from the person, then the agent's continuations with the tool results.
    assert len(human) == 1 and PROMPT in human[0]["prompt_text"], why
    turn_id = human[0]["turn_id"]
    mine = [c for c in main if c["turn_id"] == turn_id]
    assert len(mine) == len(main) >= TOOL_STEPS + 1, why
    assert [c["request_kind"] for c in mine[1:]] == ["continuation"] * (len(mine) - 1), why
    assert all(c["kind_rule"].startswith("tool_output:") for c in mine[1:]), why
    assert [c["tool_calls"] for c in mine] == [1] * TOOL_STEPS + [0] * (len(mine) - TOOL_STEPS)
    assert all(c["client"] == client and c["status"] == "ok" for c in mine), why
    turn = _wait_for_turn(query, turn_id, len(mine))
    assert turn is not None, why
    assert turn["model_calls"] == len(mine) and turn["tool_calls"] == TOOL_STEPS, why
    assert turn["status"] == "complete" and turn["tool_ms"] > 0, why
    assert turn["first_cycle_id"] == mine[0]["id"] and turn["last_cycle_id"] == mine[-1]["id"]
    assert turn["model_ms"] > 0 and turn["injected_ms"] > 0, why
    assert turn["wait_ms"] == pytest.approx(
        turn["model_ms"] + turn["tool_ms"] + turn["gap_ms"], abs=0.01)
    answer = (mine[-1]["content_text"] or "").strip()
    assert answer and answer in result.stdout, why
    return turn


@pytest.mark.parametrize("websockets", [False, True], ids=["sse", "websocket"])
def test_codex_exec_turn_is_one_human_turn(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        codex_home: Callable[..., Path], proxy_with_tools: Any,
        outbound_trap: OutboundTrap, websockets: bool) -> None:
    """Over HTTP + SSE Codex resends the whole input; over its WebSocket mode it chains
    with previous_response_id and only the tool outputs."""
    url, key, query = proxy_with_tools
    home = codex_home(url + "/v1", websockets=websockets)
    env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: key}
    # `pwd` only: `codex exec` asks no approval, and a read-only sandbox permits it.
    command = [codex_bin, "exec", "--skip-git-repo-check", "--ephemeral", "--color", "never",
               "--sandbox", "read-only", "-C", workdir, PROMPT]
    result = run_agent(command, env, workdir)
    turn = _assert_one_agent_turn(result, query, "codex")
    assert turn["protocol"] == "responses"
    assert outbound_trap.attempts == []


def test_claude_code_turn_is_one_human_turn(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], proxy_with_tools: Any,
        outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_with_tools
    env = agent_env | claude_env(url, key)
    command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence",
               "--allowedTools", "Bash(pwd)"]
    result = run_agent(command, env, workdir)
    turn = _assert_one_agent_turn(result, query, "claude-cli")
    assert turn["protocol"] == "messages"
    assert outbound_trap.attempts == []
