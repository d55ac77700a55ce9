"""Fixtures for running the real coding agents (Codex CLI, Claude Code) against flowtrial.

The agents come from tests/agents/package.json (`npm install --prefix tests/agents`). Each run
gets a HOME of its own under tmp_path, a key that is not a real one, and proxy variables
pointing at an `OutboundTrap`, so nothing can leave the machine and any attempt shows up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agents.agent_configs import codex_config, isolated_env, to_toml
from tests.agents.harness import SERVERS, AgentServer, agent_binary
from tests.agents.recording import OutboundTrap


@pytest.fixture(params=sorted(SERVERS))
def agent_server(request: pytest.FixtureRequest) -> Iterator[AgentServer]:
    """The server under test (parametrized over SERVERS), with its base URL and request log."""
    with SERVERS[request.param]() as server:
        yield server


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """The pinned Codex CLI (`codex`)."""
    return agent_binary("codex")


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """The pinned Claude Code (`claude`)."""
    return agent_binary("claude")


@pytest.fixture(scope="session")
def gemini_bin() -> Path:
    """The pinned Gemini CLI (`gemini`)."""
    return agent_binary("gemini")


@pytest.fixture
def outbound_trap() -> Iterator[OutboundTrap]:
    """Catches (and refuses) any request an agent tries to send beyond loopback."""
    with OutboundTrap() as trap:
        yield trap


@pytest.fixture
def agent_env(tmp_path: Path, outbound_trap: OutboundTrap) -> dict[str, str]:
    """A clean environment: HOME under tmp_path, no inherited keys, outbound trap proxies."""
    home = tmp_path / "home"
    home.mkdir()
    return isolated_env(home) | outbound_trap.env()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty project folder for the agent to work in."""
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def codex_home(tmp_path: Path) -> Callable[..., Path]:
    """Write `CODEX_HOME/config.toml` for a base URL; returns the CODEX_HOME folder."""

    def write(base_url: str, *, websockets: bool = False) -> Path:
        home = tmp_path / "codex_home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(to_toml(codex_config(base_url, websockets=websockets)))
        return home

    return write
