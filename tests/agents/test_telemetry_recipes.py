"""docs/clients/telemetry.md: every agent's telemetry recipe parses, is the configuration the
real-agent telemetry tests run with (tests/agents/agent_configs.py), and sends only to the
proxy's OTLP receiver on loopback with the participant key."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.agents.agent_configs import (
    OTLP_PATH,
    claude_telemetry_env,
    codex_notify,
    codex_otel,
    gemini_telemetry,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients" / "telemetry.md"
PROXY = "http://127.0.0.1:8787"
KEY = "ft_your_participant_key"
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _blocks(section: str, language: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    parts = {title.strip(): body for title, _, body in (
        p.partition("\n") for p in re.split(r"^### ", text, flags=re.MULTILINE)[1:])}
    assert section in parts, f"{DOC.name} has no section {section!r}"
    found = [m.group(2) for m in _FENCE.finditer(parts[section])
             if m.group(1).strip() == language]
    assert found, f"{DOC.name}: section {section!r} has no {language} block"
    return found


def _exports(script: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in
            re.findall(r"^export (\w+)=(\"[^\"]*\"|\S+)", script, flags=re.MULTILINE)}


def _on_receiver(url: str, *, full: bool = False) -> None:
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port == 8787
    assert parts.path == (OTLP_PATH + "/v1/logs" if full else OTLP_PATH)


def test_claude_code_recipe_is_what_the_tests_run() -> None:
    (script,) = _blocks("Claude Code", "bash")
    env = _exports(script)
    assert env == claude_telemetry_env(PROXY, KEY, fast=False)
    _on_receiver(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == f"Authorization=Bearer {KEY}"


def test_codex_recipe_is_what_the_tests_run() -> None:
    (block,) = _blocks("Codex CLI", "toml")
    config = tomllib.loads(block)
    otel = config["otel"]
    assert otel == codex_otel(PROXY, KEY, protocol="json")
    assert config["notify"] == codex_notify(PROXY)
    _on_receiver(otel["exporter"]["otlp-http"]["endpoint"], full=True)


def test_gemini_cli_recipe() -> None:
    (block,) = _blocks("Gemini CLI", "json")
    settings: dict[str, Any] = json.loads(block)
    assert settings["telemetry"] == gemini_telemetry(PROXY)
    _on_receiver(settings["telemetry"]["otlpEndpoint"])
    (script,) = _blocks("Gemini CLI", "bash")
    assert _exports(script) == {"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {KEY}"}


def test_the_receiver_serves_the_documented_paths() -> None:
    pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")
    from flowtrial.instrumentation.telemetry.receiver import OTLP_PREFIX, telemetry_routes
    from flowtrial.study.config import parse_study

    assert OTLP_PREFIX == OTLP_PATH
    config = parse_study({"study": {"name": "doc", "design": "parallel"},
                          "arms": [{"name": "a"}]})
    paths = {r.path for r in telemetry_routes(None, config)}  # type: ignore[arg-type, attr-defined]
    assert paths == {f"{OTLP_PATH}/v1/{s}" for s in ("logs", "traces", "metrics")}
