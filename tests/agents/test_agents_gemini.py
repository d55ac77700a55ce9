"""The real Gemini CLI (pinned in tests/agents) through `flowtrial proxy` as users run it: a
multi-step turn against the simulated model (`tool_steps = 3`: three `list_directory` calls,
then the answer) over Google's Gemini API (`GOOGLE_GEMINI_BASE_URL`), recorded as one human
turn, with Gemini CLI's own OpenTelemetry on the proxy's receiver joining that turn; nothing
leaves 127.0.0.1 (the outbound trap stays empty: no update check, no usage statistics).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import MODEL, gemini_env, gemini_settings
from tests.agents.harness import flowtrial_proxy, run_agent
from tests.agents.recording import OutboundTrap
from tests.agents.test_agent_turns import PROMPT, TOOL_STEPS, _assert_one_agent_turn
from tests.agents.test_agents_telemetry import _otel_events

pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")


@pytest.fixture
def proxy_with_tools(tmp_path: Path) -> Any:
    folder = tmp_path / "study"
    folder.mkdir()
    with flowtrial_proxy(folder, tool_steps=TOOL_STEPS) as served:
        yield served


def test_gemini_cli_turn_is_one_human_turn_with_its_telemetry(
        gemini_bin: Path, workdir: Path, agent_env: dict[str, str], proxy_with_tools: Any,
        outbound_trap: OutboundTrap) -> None:
    url, key, query = proxy_with_tools
    settings = Path(agent_env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps(gemini_settings(url)), encoding="utf-8")
    env = agent_env | gemini_env(url, key) | {
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {key}"}
    result = run_agent([gemini_bin, "-p", PROMPT, "-m", MODEL], env, workdir)
    # Its User-Agent is `GeminiCLI-tui/0.61.0/<model> (…)`: recorded as the agent's name.
    turn = _assert_one_agent_turn(result, query, "gemini-cli")
    assert turn["protocol"] == "gemini"
    cycles = query("SELECT id, turn_id, model FROM cycles ORDER BY t_request_ns")
    assert {c["model"] for c in cycles} == {MODEL}
    rows = _otel_events(query, {"turn_start", "api_request"})
    kinds = [r["kind"] for r in rows]
    assert "turn_start" in kinds and "api_request" in kinds, kinds
    assert {r["participant_id"] for r in rows} == {"p01"}
    # Its timed requests are the turn's cycles (linked on arrival), each at most once.
    linked = [r["cycle_id"] for r in rows if r["kind"] == "api_request" and r["cycle_id"]]
    assert linked and set(linked) <= {c["id"] for c in cycles if c["turn_id"] == turn["id"]}
    assert outbound_trap.attempts == []
