"""The real agents with their own OpenTelemetry pointed at `flowtrial proxy` (the CLI, as users
run it): Claude Code over OTLP/HTTP protobuf, Codex over OTLP/HTTP JSON. Their records
arrive at the proxy's receiver, are mapped (`source = "otel"`) and linked to the turn's
cycles; nothing goes anywhere but 127.0.0.1 (the outbound trap stays empty).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import (
    KEY_ENV,
    MODEL,
    claude_env,
    claude_telemetry_env,
    codex_config,
    codex_notify,
    codex_otel,
    to_toml,
)
from tests.agents.harness import flowtrial_proxy, run_agent
from tests.agents.recording import OutboundTrap
from tests.agents.test_agents_mock import PROMPT, _codex_command
from tests.agents.tool_turns import COMMAND, serve_tool_proxy

pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")


@pytest.fixture
def proxy_cli(tmp_path: Path) -> Any:
    with flowtrial_proxy(tmp_path) as served:
        yield served


def _explain(result: subprocess.CompletedProcess[str], rows: list[Any]) -> str:
    ev = "\n".join(str(dict(r)) for r in rows)
    return (f"exit {result.returncode}\n--- events\n{ev or '(none)'}\n"
            f"--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-3000:]}")


def _otel_events(query: Callable[[str], list[Any]], want: set[str],
                 timeout_s: float = 15.0) -> list[Any]:
    """The otel events once every kind in ``want`` has arrived (exporters flush at exit,
    the proxy writes a moment later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = query("SELECT kind, cycle_id, ts_ns, duration_s, source, payload_json, "
                     "participant_id FROM events WHERE source = 'otel' ORDER BY ts_ns, id")
        if want <= {r["kind"] for r in rows} or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _cycles(query: Callable[[str], list[Any]]) -> dict[str, Any]:
    return {r["id"]: r for r in query("SELECT id, model, prompt_text FROM cycles")}


def test_claude_code_telemetry_over_protobuf(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], proxy_cli: Any,
        outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_cli
    env = agent_env | claude_env(url, key) | claude_telemetry_env(url, key)
    command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence"]
    result = run_agent(command, env, workdir)
    rows = _otel_events(query, {"turn_start", "api_request"})
    assert result.returncode == 0, _explain(result, rows)
    cycles = _cycles(query)
    kinds = [r["kind"] for r in rows]
    assert "turn_start" in kinds and "api_request" in kinds, _explain(result, rows)
    assert {r["participant_id"] for r in rows} == {"p01"}
    # Every model request Claude Code timed is one of the proxy's cycles, each at most once.
    requests = [r for r in rows if r["kind"] == "api_request"
                and not json.loads(r["payload_json"]).get("span")]
    assert requests and all(r["cycle_id"] in cycles for r in requests), _explain(result, rows)
    assert len({r["cycle_id"] for r in requests}) == len(requests)
    assert all(json.loads(r["payload_json"])["model"] == cycles[r["cycle_id"]]["model"]
               for r in requests)
    # The prompt starts the turn: linked to the cycle that carried it.
    start = next(r for r in rows if r["kind"] == "turn_start")
    assert start["cycle_id"] in cycles
    assert PROMPT in (cycles[start["cycle_id"]]["prompt_text"] or ""), _explain(result, rows)
    assert json.loads(start["payload_json"])["prompt_length"] == len(PROMPT)
    assert outbound_trap.attempts == []


def test_codex_telemetry_over_json(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        proxy_cli: Any, outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_cli
    home = tmp_path / "codex_home"
    home.mkdir()
    config = codex_config(url + "/v1") | {"otel": codex_otel(url, key, protocol="json")}
    (home / "config.toml").write_text(to_toml(config))
    env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: key}
    result = run_agent(_codex_command(codex_bin, workdir), env, workdir)
    rows = _otel_events(query, {"turn_start", "api_request"})
    assert result.returncode == 0, _explain(result, rows)
    cycles = _cycles(query)
    kinds = [r["kind"] for r in rows]
    assert "turn_start" in kinds and "api_request" in kinds, _explain(result, rows)
    requests = [r for r in rows if r["kind"] == "api_request"]
    assert all(r["cycle_id"] in cycles for r in requests), _explain(result, rows)
    start = next(r for r in rows if r["kind"] == "turn_start")
    assert PROMPT in (cycles[start["cycle_id"]]["prompt_text"] or ""), _explain(result, rows)
    assert "prompt" not in json.loads(start["payload_json"])  # log_user_prompt = false
    assert outbound_trap.attempts == []


def _by_kind(rows: list[Any], kind: str) -> list[dict[str, Any]]:
    return [dict(r) | {"payload": json.loads(r["payload_json"])} for r in rows
            if r["kind"] == kind]


def _turn_of_tool_call(db: Path, query: Callable[[str], list[Any]], tool_cycle: str,
                       explain: str) -> Any:
    """The agent's telemetry tied to the turn holding ``tool_cycle`` (through
    ``flowtrial.analysis.turn_telemetry``): its prompt, its one tool decision (by config),
    the tool's own run time beside the proxy's tool time; returns that turn's row."""
    from flowtrial.analysis.turn_telemetry import events_by_turn, read_turn_inputs, turn_table
    from flowtrial.study.storage import open_db

    deadline = time.monotonic() + 10  # the proxy writes the turn's row after its last call
    while not query("SELECT t.id FROM turns t JOIN cycles c ON c.turn_id = t.id WHERE "
                    f"c.id = '{tool_cycle}' AND t.status = 'complete'"):
        assert time.monotonic() < deadline, explain
        time.sleep(0.1)
    (turn_id,) = query(f"SELECT turn_id FROM cycles WHERE id = '{tool_cycle}'")[0]
    database = open_db(db)
    try:
        events, turns, cycles = read_turn_inputs(database)
    finally:
        database.dispose()
    linked = events_by_turn(events, turns, cycles)
    mine = linked[linked["turn_id"] == turn_id]
    kinds = set(mine["kind"])
    assert {"turn_start", "accept", "tool_result", "api_request"} <= kinds, explain
    # Decisions and tool runs through the tool call's cycle; the prompt opens the turn.
    assert set(mine.loc[mine["kind"].isin(["accept", "tool_result"]), "turn_link"]) == {
        "cycle"}, explain
    table = turn_table(linked, turns, cycles).set_index("turn_id")
    row = table.loc[turn_id]
    assert (row["prompts"], row["decisions"], row["by_config"], row["by_person"]) == (
        1, 1, 1, 0), explain
    assert row["agent_tool_s"] is not None and row["agent_tool_s"] >= 0
    assert row["proxy_tool_s"] > 0 and row["prompt_to_request_s"] >= 0, explain
    # Each model request the agent timed (its log, not the beta span's copy) is one call.
    assert row["agent_requests"] == row["model_calls"] >= 2, explain
    return row


def _tool_turn(result: subprocess.CompletedProcess[str], query: Callable[[str], list[Any]],
               upstream: Any, db: Path) -> tuple[dict[str, Any], list[Any], set[str], Any]:
    """Checks common to a tool turn (the agent ran, the model asked for one tool, the
    agent's configuration approved it and the tool ran, both on the cycle that asked, and
    all of it, the prompt too, on the turn holding that cycle); returns (the decision, the
    otel events, the cycle ids, the turn's row of telemetry)."""
    rows = _otel_events(query, {"turn_start", "api_request", "accept", "tool_result"})
    cycles = query("SELECT id, tool_calls FROM cycles ORDER BY t_request_ns")
    assert result.returncode == 0, _explain(result, rows)
    assert upstream.tool_calls == 1
    tool_cycle = next(c["id"] for c in cycles if c["tool_calls"] == 1)
    (decision,) = _by_kind(rows, "accept")
    assert decision["payload"]["decided_by"] == "config", _explain(result, rows)
    assert decision["cycle_id"] == tool_cycle
    (ran,) = _by_kind(rows, "tool_result")
    assert ran["cycle_id"] == tool_cycle and ran["payload"]["success"]
    assert ran["duration_s"] is not None and ran["duration_s"] >= 0
    assert not _by_kind(rows, "agent_wait")  # a rule decided: the agent waited for no one
    turn = _turn_of_tool_call(db, query, tool_cycle, _explain(result, rows))
    return decision, rows, {c["id"] for c in cycles}, turn


def test_claude_code_tool_decision_is_linked_to_the_answer_that_proposed_it(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    """The model asks to run a shell command; Claude Code's permission rule allows it: the
    decision (accept, decided by config), the tool's run and the turn's requests arrive,
    each on the cycle it belongs to."""
    with serve_tool_proxy(tmp_path / "proxy") as (url, key, query, upstream):
        env = agent_env | claude_env(url, key) | claude_telemetry_env(url, key)
        command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence",
                   "--allowedTools", f"Bash({COMMAND})"]
        result = run_agent(command, env, workdir)
        decision, rows, cycles, turn = _tool_turn(result, query, upstream,
                                                  tmp_path / "proxy" / "study.db")
    assert decision["payload"]["tool"] == "Bash", _explain(result, rows)
    assert turn["turn_ends"] == 1  # its interaction span
    requests = [r for r in _by_kind(rows, "api_request") if not r["payload"].get("span")]
    assert {r["cycle_id"] for r in requests} == cycles, _explain(result, rows)
    assert outbound_trap.attempts == []


def test_codex_tool_decision_is_linked_to_the_answer_that_proposed_it(
        codex_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    """The model asks Codex to run a command; its policy (never ask, full access) approves
    it: the decision (approved, source config), the tool's run and the requests arrive over
    OTLP/HTTP JSON, each on its cycle; its notify hook (`flowtrial codex-notify`) reports the
    turn's end, which lands on the same turn."""
    with serve_tool_proxy(tmp_path / "proxy") as (url, key, query, upstream):
        home = tmp_path / "codex_home"
        home.mkdir()
        config = codex_config(url + "/v1") | {
            "approval_policy": "never", "sandbox_mode": "danger-full-access",
            "otel": codex_otel(url, key, protocol="json"),
            "notify": codex_notify(url, (sys.executable, "-m", "flowtrial.cli"))}
        (home / "config.toml").write_text(to_toml(config))
        env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: key}
        result = run_agent(_codex_command(codex_bin, workdir), env, workdir)
        _otel_events(query, {"turn_end"})  # the notify program runs after the turn
        decision, rows, cycles, turn = _tool_turn(result, query, upstream,
                                                  tmp_path / "proxy" / "study.db")
    assert decision["payload"]["decision"] == "approved", _explain(result, rows)
    (end,) = _by_kind(rows, "turn_end")
    assert end["payload"]["otel"] == "codex.agent_turn_complete", _explain(result, rows)
    assert (end["payload"]["client"], end["payload"]["input_messages"]) == ("codex_exec", 1)
    assert end["payload"]["input_length"] == len(PROMPT)
    assert turn["turn_ends"] == 1, _explain(result, rows)
    assert decision["payload"]["source"].lower() == "config"  # 0.169 writes "Config"
    requests = _by_kind(rows, "api_request")
    assert requests and all(r["cycle_id"] in cycles for r in requests)
    assert outbound_trap.attempts == []


def test_claude_code_refused_tool_leaves_no_accept_and_no_run(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    """A command that changes files, with no rule allowing it: `claude -p` has no one to ask
    and refuses it. Claude Code 2.1.197 logs no `tool_decision` for that refusal; only its
    beta `tool.blocked_on_user` span says `decision = reject` (source unknown), kept as a
    custom event — no accept, no tool run, no wait for a person."""
    with serve_tool_proxy(tmp_path / "proxy", "touch flowtrial.txt") as (
            url, key, query, upstream):
        env = agent_env | claude_env(url, key) | claude_telemetry_env(url, key)
        command = [claude_bin, "-p", PROMPT, "--model", MODEL, "--no-session-persistence"]
        result = run_agent(command, env, workdir)
        rows = _otel_events(query, {"turn_start", "api_request", "turn_end"})
    assert result.returncode == 0, _explain(result, rows)
    assert upstream.tool_calls == 1 and not (workdir / "flowtrial.txt").exists()
    assert not _by_kind(rows, "accept") and not _by_kind(rows, "tool_result")
    assert not _by_kind(rows, "agent_wait")
    spans = [r["payload"] for r in _by_kind(rows, "custom")
             if r["payload"]["name"] == "claude_code.tool.blocked_on_user"]
    assert [s["attributes"]["decision"] for s in spans] == ["reject"], _explain(result, rows)
    assert outbound_trap.attempts == []
