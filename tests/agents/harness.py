"""The real-agent test harness: the server agents talk to, where the agents are installed,
and running one to completion (no stdin, bounded in time)."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.recording import RequestLog

__all__ = ["AGENT_TIMEOUT_S", "BIN_DIR", "SERVERS", "AgentServer", "agent_binary", "run_agent"]

AGENTS_DIR = Path(__file__).resolve().parent
BIN_DIR = AGENTS_DIR / "node_modules" / ".bin"
AGENT_TIMEOUT_S = 120.0  # one agent run; a healthy one takes a few seconds


@dataclass
class AgentServer:
    """The server the agents talk to, the key they send, and what it received."""

    base_url: str  # root URL, no /v1 (Claude Code's ANTHROPIC_BASE_URL)
    key: str
    log: RequestLog

    @property
    def openai_base_url(self) -> str:
        """The OpenAI-style base URL (Codex `base_url`, `OPENAI_API_BASE`)."""
        return self.base_url + "/v1"


@contextmanager
def _serve_mock() -> Iterator[AgentServer]:
    """The built-in simulated model, fast, behind a request log."""
    from instrumentation.mock_model import MockModel
    from instrumentation.mock_model.app import create_mock_app
    from tests.instrumentation.servers import run_asgi_server

    log = RequestLog(create_mock_app(MockModel(tokens_per_second=math.inf, ttft_ms=5)))
    with run_asgi_server(log) as base_url:
        yield AgentServer(base_url, "ft_agenttest_not-a-real-key", log)


# What the agents can be pointed at. Once the proxy speaks Anthropic Messages and the
# Responses WebSocket mode, add e.g. "proxy": a `flowtrial proxy` with the mock upstream.
SERVERS: dict[str, Callable[[], AbstractContextManager[AgentServer]]] = {"mock": _serve_mock}


def agent_binary(name: str) -> Path:
    """An installed agent; skips when node is absent, fails when the packages are missing."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the real-agent tests need Node.js and "
                    "`npm ci --prefix tests/agents`")
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `npm ci --prefix tests/agents` to install the "
                    "pinned Codex CLI and Claude Code", pytrace=False)
    return path


def run_agent(command: list[str | Path], env: dict[str, str], cwd: Path,
              timeout: float = AGENT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run an agent to completion with no stdin; on timeout kill its whole process group
    (agents start helpers) and fail the test with what it printed."""
    process = subprocess.Popen(
        [str(c) for c in command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{Path(str(command[0])).name} did not finish within {timeout:.0f} s\n"
                    f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
