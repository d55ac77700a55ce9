"""Agents nobody tuned the turn rules to, through `flowtrial proxy`: one `human` turn per
typed prompt (docs/concepts/turns.md).

- **opencode** (`opencode run`, pinned in tests/agents/package.json) sends a session-title
  call (no tools, its own system prompt, the typed text as the user message) before the main
  request, also as the participant's very first request: the main request revises it to a
  `side` call of its turn. The simulated model (`tool_steps = 3`) makes opencode run `pwd`
  through its `bash` tool three times: all of it is the one turn.
- **aider** (`--message`, pinned in its own virtual environment by
  tests/agents/install_aider.sh; skipped when absent) gets a first answer that breaks its
  edit format (a code fence with no file name, the simulated model's `script`): aider
  re-asks by itself at once, and the typing-speed rule joins the re-ask to the turn.

Each agent gets two typed prompts; the database then holds two `human` turns, rebuilding the
turns from the cycles gives the same rows, and the analysis counts two waits.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import (
    aider_args,
    aider_metadata,
    opencode_env,
    opencode_offline_home,
)
from tests.agents.harness import ROOT, agent_binary, flowtrial_proxy, run_agent
from tests.agents.recording import OutboundTrap

TOOL_STEPS = 3
PROMPTS = ("Which folder are we in? Check, then answer.",
           "Is that folder empty? Check again, then answer.")
#: aider's whole-file format needs a file name before a fence: the first answer breaks it.
SCRIPT = ("```\nprint('hello')\n```", "Hello! There is nothing to change here.")
AIDER = ROOT / ".aider-venv" / "bin" / "aider"
_CYCLES = ("id, request_kind, kind_rule, revised_from, turn_id, client, client_sdk, tool_calls, "
           "status, prompt_text, t_request_ns, t_last_sent_ns, t_done_ns, wall_anchor_ns, "
           "mono_anchor_ns")
Query = Callable[[str], list[Any]]


@pytest.fixture(scope="session")
def opencode_bin() -> Path:
    """The pinned opencode (`opencode-ai`)."""
    return agent_binary("opencode")


@pytest.fixture(scope="session")
def aider_bin() -> Path:
    """aider from its own virtual environment (tests/agents/install_aider.sh)."""
    if not AIDER.exists():
        pytest.skip(f"aider is not installed ({AIDER} is missing): run "
                    "`bash tests/agents/install_aider.sh` (.ci/run does)")
    return AIDER


def _cycles(query: Query) -> list[dict[str, Any]]:
    return [dict(r) for r in query(f"SELECT {_CYCLES} FROM cycles ORDER BY t_request_ns")]


def _turns(query: Query) -> list[dict[str, Any]]:
    return [dict(r) for r in query("SELECT * FROM turns ORDER BY t_start_ns")]


def _explain(query: Query, results: list[subprocess.CompletedProcess[str]]) -> str:
    cycles = "\n".join(str({k: v for k, v in c.items() if k != "prompt_text"})
                       for c in _cycles(query))
    turns = "\n".join(str(t) for t in _turns(query))
    runs = "\n".join(f"exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
                     for r in results)
    return f"--- cycles\n{cycles}\n--- turns\n{turns}\n--- runs\n{runs}"


def _settled(query: Query, calls: int) -> list[dict[str, Any]]:
    """The turn rows once they count ``calls`` model calls in all (the proxy writes a turn's
    row with its last cycle, after the answer went out)."""
    deadline = time.monotonic() + 10
    while True:
        turns = _turns(query)
        if sum(t["model_calls"] for t in turns) >= calls or time.monotonic() > deadline:
            return turns
        time.sleep(0.1)


def _check_rebuild_and_waits(db: Path, turns: list[dict[str, Any]], prompts: int) -> None:
    """`rebuild_turns` from the cycles gives the proxy's rows; the analysis waits once per
    typed prompt."""
    import pandas as pd

    from flowtrial.analysis.turns import waiting_units
    from flowtrial.study.storage import open_db
    from flowtrial.study.turns import rebuild_turns

    database = open_db(db)
    try:
        assert rebuild_turns(database) == len(turns)
        with database.engine.connect() as conn:
            rebuilt = [dict(r) for r in conn.exec_driver_sql(
                "SELECT * FROM turns ORDER BY t_start_ns").mappings()]
            cycles = pd.read_sql("SELECT * FROM cycles", conn)
    finally:
        database.dispose()
    assert rebuilt == turns
    units, unit = waiting_units(cycles)
    assert (unit.unit, len(units)) == ("turn", prompts)


def _report(agent: str, cycles: list[dict[str, Any]]) -> None:
    humans = sum(1 for c in cycles if c["request_kind"] == "human")
    print(f"\n{agent}: {len(PROMPTS)} typed prompts, {humans} human turns, "
          f"{len(cycles)} model calls: "
          + ", ".join(f"{c['request_kind']}/{c['kind_rule']}" for c in cycles))


def test_opencode_title_call_is_side_and_each_prompt_one_turn(
        opencode_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    folder = tmp_path / "study"
    folder.mkdir()
    opencode_offline_home(Path(agent_env["XDG_CONFIG_HOME"]))
    with flowtrial_proxy(folder, tool_steps=TOOL_STEPS) as (url, key, query):
        env = agent_env | opencode_env(url + "/v1", key)
        results = [run_agent([opencode_bin, "run", prompt], env, workdir) for prompt in PROMPTS]
        why = _explain(query, results)
        assert all(r.returncode == 0 for r in results), why
        turns = _settled(query, len(PROMPTS) * (TOOL_STEPS + 1))
        cycles = _cycles(query)
        _report("opencode", cycles)
        why = _explain(query, results)
        human = [c for c in cycles if c["request_kind"] == "human"]
        assert len(human) == len(PROMPTS) and len(turns) == len(PROMPTS), why
        # opencode sends the first run's title call and main request at once, so either may
        # arrive first. A title call ahead of the main request looks like new input and is
        # revised once the main request with the same typed text comes; one behind it is a
        # side call of the open turn on arrival. Either way it joins the first turn.
        title = next(c for c in cycles if c["request_kind"] == "side")
        if title["t_request_ns"] < human[0]["t_request_ns"]:
            expected = ("revised:same_input_before_main", "human:new_input")
        else:
            expected = ("other_conversation_while_open", None)
        assert (title["kind_rule"], title["revised_from"]) == expected, why
        assert title["turn_id"] == human[0]["turn_id"], why
        for prompt, h, turn in zip(PROMPTS, human, turns, strict=True):
            assert prompt in h["prompt_text"], why
            mine = [c for c in cycles if c["turn_id"] == h["turn_id"]]
            main = [c for c in mine if c["request_kind"] != "side"]
            assert [c["request_kind"] for c in main] == (
                ["human"] + ["continuation"] * TOOL_STEPS), why
            assert [c["tool_calls"] for c in main] == [1] * TOOL_STEPS + [0], why
            assert turn["id"] == h["turn_id"] and turn["status"] == "complete", why
            assert (turn["model_calls"], turn["tool_calls"]) == (TOOL_STEPS + 1, TOOL_STEPS)
            assert turn["side_calls"] == len(mine) - len(main), why
        # Each run's title call is a side call: the first as above; a later one may
        # already be `side` at arrival (the same agent offered tools on its latest turn).
        side = [c for c in cycles if c["request_kind"] == "side"]
        assert len(side) == len(PROMPTS) and turns[0]["side_calls"] == 1, why
        assert all(any(p in (c["prompt_text"] or "") for p in PROMPTS) for c in side), why
        assert {(c["client"], c["client_sdk"]) for c in cycles} == {("opencode", "ai-sdk")}
        _check_rebuild_and_waits(folder / "study.db", turns, len(PROMPTS))
    assert outbound_trap.attempts == []


def test_aider_reask_after_a_broken_edit_format_joins_the_turn(
        aider_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path,
        outbound_trap: OutboundTrap) -> None:
    folder = tmp_path / "study"
    folder.mkdir()
    metadata = tmp_path / "aider.model.metadata.json"
    metadata.write_text(json.dumps(aider_metadata()))
    with flowtrial_proxy(folder, script=SCRIPT) as (url, key, query):
        env = agent_env | {"OPENAI_API_BASE": url + "/v1", "OPENAI_API_KEY": key,
                           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        results = [run_agent([aider_bin, "--message", prompt, *aider_args(metadata)], env,
                             workdir) for prompt in PROMPTS]
        why = _explain(query, results)
        assert all(r.returncode == 0 for r in results), why
        assert all("No filename provided" in r.stdout + r.stderr for r in results), why
        turns = _settled(query, 2 * len(PROMPTS))
        cycles = _cycles(query)
        _report("aider", cycles)
        why = _explain(query, results)
        # Per prompt: the person's request, then aider's re-ask (a user message it wrote).
        assert [(c["request_kind"], c["kind_rule"]) for c in cycles] == [
            ("human", "new_input"), ("continuation", "faster_than_typing")] * len(PROMPTS), why
        assert all("No filename provided" in c["prompt_text"] for c in cycles[1::2]), why
        assert [c["turn_id"] for c in cycles[1::2]] == [c["turn_id"] for c in cycles[::2]]
        assert [(t["model_calls"], t["status"]) for t in turns] == [
            (2, "complete")] * len(PROMPTS), why
        gaps = [(b["t_request_ns"] - (a["t_last_sent_ns"] or a["t_done_ns"])) / 1e9
                for a, b in zip(cycles, cycles[1:], strict=False)]
        print(f"aider: answer end -> next request gaps (s): {[round(g, 3) for g in gaps]}")
        assert max(gaps[0::2]) < 1.0 < min(gaps[1::2]), gaps  # re-asks vs the next prompt
        assert {(c["client"], c["client_sdk"]) for c in cycles} == {
            ("openai/python", "openai/python")}
        _check_rebuild_and_waits(folder / "study.db", turns, len(PROMPTS))
    assert outbound_trap.attempts == []
