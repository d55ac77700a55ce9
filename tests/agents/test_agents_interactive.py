"""A tool decision made by a person: the real Claude Code, interactive in a pseudo-terminal,
asks for permission to run a command the model proposed; the test answers as a person would
(Yes once, or Esc = No). `claude -p` cannot do this: it has nobody to ask.

The agent's telemetry then carries the person's decision (`claude_code.tool_decision` with
source `user_temporary` / `user_reject`) and the time it waited for the answer
(`tool.blocked_on_user`), both linked to the cycle whose answer proposed the tool and tied
to the agent turn holding it (`flowtrial.analysis.turn_telemetry`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import MODEL, claude_env, claude_telemetry_env
from tests.agents.recording import OutboundTrap
from tests.agents.tool_turns import serve_tool_proxy

pexpect = pytest.importorskip("pexpect", reason="the interactive test drives a terminal")

COMMAND = "touch flowtrial.txt"  # no rule allows it: Claude Code asks the person
PROMPT = "Create the file flowtrial.txt please"
THINK_S = 1.5  # the "person" reads the permission prompt this long before answering


def _trusting_home(home: Path, workdir: Path, key: str) -> None:
    """Claude Code's user config as after its first run: onboarding done, the key approved,
    the project folder trusted (else it shows those dialogs before the prompt)."""
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "theme": "dark", "numStartups": 5,
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {str(workdir): {"hasTrustDialogAccepted": True, "allowedTools": []}},
    }))


def _otel(query: Any, want: set[str], child: Any, timeout_s: float = 60.0
          ) -> list[dict[str, Any]]:
    """The otel events once every kind in ``want`` arrived, reading the terminal meanwhile
    (a terminal nobody reads fills up and blocks Claude Code's next write)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [dict(r) | {"payload": json.loads(r["payload_json"])} for r in query(
            "SELECT kind, cycle_id, ts_ns, duration_s, payload_json FROM events "
            "WHERE source = 'otel' ORDER BY ts_ns, id")]
        if want <= {r["kind"] for r in rows} or time.monotonic() > deadline:
            return rows
        child.expect([pexpect.TIMEOUT, pexpect.EOF], timeout=0.2)


@pytest.mark.parametrize(("answer", "kind", "source"), [
    ("1", "accept", "user_temporary"),  # "1. Yes" (once)
    ("\x1b", "reject", "user_reject"),  # Esc: "No, and tell Claude what to do differently"
], ids=["yes-once", "no"])
def test_the_persons_tool_decision_lands_on_the_turn(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap, answer: str, kind: str, source: str) -> None:
    from flowtrial.analysis.turn_telemetry import events_by_turn, read_turn_inputs, turn_table
    from flowtrial.study.storage import open_db

    with serve_tool_proxy(tmp_path / "proxy", COMMAND) as (url, key, query, upstream):
        home = Path(agent_env["HOME"])
        _trusting_home(home, workdir, key)
        env = agent_env | claude_env(url, key) | claude_telemetry_env(url, key) | {
            "TERM": "xterm-256color",
            # the interactive UI fetches the official plugin marketplace at start
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1"}
        env.pop("NO_COLOR", None)
        child = pexpect.spawn(str(claude_bin), ["--model", MODEL], cwd=str(workdir), env=env,
                              encoding="utf-8", dimensions=(50, 160), timeout=60)
        screen: list[str] = []
        child.logfile_read = _Collect(screen)
        try:
            child.expect("/effort", timeout=90)  # the status line under the input box
            time.sleep(1.0)  # the input box takes keys once drawn
            child.send(PROMPT)
            time.sleep(0.5)
            child.send("\r")
            child.expect(r"proceed\?", timeout=90)  # "Do you want to proceed?"
            time.sleep(THINK_S)
            child.send(answer)
            # the turn's end too: Claude Code's spans leave when its interaction ends
            rows = _otel(query, {"turn_start", kind, "agent_wait", "turn_end"}, child)
        finally:
            child.sendcontrol("c")
            time.sleep(0.3)
            child.sendcontrol("c")
            child.close(force=True)
        explain = ("".join(screen)[-3000:] + "\n--- events\n"
                   + "\n".join(f"{r['kind']} {r['cycle_id']} {r['payload']}" for r in rows))
        cycles = query("SELECT id, request_kind, turn_id, tool_calls FROM cycles "
                       "ORDER BY t_request_ns")
    assert upstream.tool_calls == 1, explain
    assert (workdir / "flowtrial.txt").exists() == (kind == "accept"), explain
    tool_cycle = next(c for c in cycles if c["tool_calls"] == 1)
    (decision,) = [r for r in rows if r["kind"] in ("accept", "reject")]
    assert decision["kind"] == kind, explain
    p = decision["payload"]
    assert (p["source"], p["decided_by"], p["tool"]) == (source, "person", "Bash"), explain
    assert decision["cycle_id"] == tool_cycle["id"], explain  # not the title side call
    waits = [r for r in rows if r["kind"] == "agent_wait"]
    assert len(waits) == 1, explain
    (waited,) = waits
    assert waited["cycle_id"] == tool_cycle["id"] and waited["payload"]["source"] == source
    assert THINK_S * 0.8 <= waited["duration_s"] < 60, explain
    # Tied to the turn that holds the proposing call, with the person's time to decide.
    database = open_db(tmp_path / "proxy" / "study.db")
    try:
        events, turns, cyc = read_turn_inputs(database)
    finally:
        database.dispose()
    linked = events_by_turn(events, turns, cyc)
    turn_id = tool_cycle["turn_id"]
    mine = linked[linked["turn_id"] == turn_id]
    assert {"turn_start", kind, "agent_wait"} <= set(mine["kind"]), explain
    row = turn_table(linked, turns, cyc).set_index("turn_id").loc[turn_id]
    assert (row["prompts"], row["by_person"], row["by_config"]) == (1, 1, 0), explain
    assert row["person_accepts" if kind == "accept" else "person_rejects"] == 1
    assert row["agent_waited_s"] == pytest.approx(waited["duration_s"])
    assert THINK_S * 0.8 <= row["time_to_decide_s"] < 60, explain
    assert outbound_trap.attempts == []


class _Collect:
    """What the terminal showed (for failure messages)."""

    def __init__(self, out: list[str]) -> None:
        self.out = out

    def write(self, text: str) -> None:
        self.out.append(text)

    def flush(self) -> None:
        pass
