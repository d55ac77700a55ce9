"""The real-agent test harness: the server agents talk to, where the agents are installed,
and running one to completion (no stdin, bounded in time)."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agents.recording import RequestLog

__all__ = [
    "AGENT_TIMEOUT_S",
    "BIN_DIR",
    "PROXY_STUDY",
    "SERVERS",
    "TARGET_TTFT_MS",
    "AgentServer",
    "agent_binary",
    "flowtrial_proxy",
    "run_agent",
]

AGENTS_DIR = Path(__file__).resolve().parent
BIN_DIR = AGENTS_DIR / "node_modules" / ".bin"
AGENT_TIMEOUT_S = 120.0  # one agent run; a healthy one takes a few seconds
ROOT = AGENTS_DIR.parents[1]
TARGET_TTFT_MS = 300.0
#: The study the agents run under through the proxy: shaping on, a fast simulated model.
PROXY_STUDY = f"""
[study]
name = "agent-tests"
design = "parallel"
[upstream.mock]
tokens_per_second = 5000
ttft_ms = 5
[capture]
content = "full"
[[arms]]
name = "shaped"
ttft_ms = {TARGET_TTFT_MS}
tokens_per_second = 400
"""


@dataclass
class AgentServer:
    """The server the agents talk to, the key they send, and what it received."""

    base_url: str  # root URL, no /v1 (Claude Code's ANTHROPIC_BASE_URL)
    key: str
    log: RequestLog
    #: For a proxy: run SQL on its study database (None for the bare simulated model).
    rows: Callable[[str], list[Any]] | None = None

    @property
    def openai_base_url(self) -> str:
        """The OpenAI-style base URL (Codex `base_url`, `OPENAI_API_BASE`)."""
        return self.base_url + "/v1"


@contextmanager
def _serve_mock() -> Iterator[AgentServer]:
    """The built-in simulated model, fast, behind a request log."""
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app
    from tests.instrumentation.servers import run_asgi_server

    log = RequestLog(create_mock_app(MockModel(tokens_per_second=math.inf, ttft_ms=5)))
    with run_asgi_server(log) as base_url:
        yield AgentServer(base_url, "ft_agenttest_not-a-real-key", log)


def _study_db(folder: Path, tool_steps: int = 0, script: tuple[str, ...] = ()
              ) -> tuple[Path, Path, str]:
    """PROXY_STUDY (with ``[upstream] tool_steps`` and the simulated model's ``script``)
    written to ``folder``, its database, and an enrolled participant's key."""
    import json

    from flowtrial.study.config import load_study
    from flowtrial.study.participants import enroll
    from flowtrial.study.storage import init_db

    text = PROXY_STUDY.replace("[upstream.mock]", f"[upstream]\ntool_steps = {tool_steps}\n"
                               f"[upstream.mock]\nscript = {json.dumps(list(script))}")
    study = folder / "study.toml"
    study.write_text(text, encoding="utf-8")
    db = folder / "study.db"
    config = load_study(study)
    database = init_db(db, config, text)
    key = enroll(database, config, "p01")[1]
    database.dispose()
    return study, db, key


def _query(db: Path) -> Callable[[str], list[Any]]:
    import sqlite3

    def rows(sql: str) -> list[Any]:
        conn = sqlite3.connect(db)
        conn.row_factory = sqlite3.Row
        try:
            return list(conn.execute(sql))
        finally:
            conn.close()

    return rows


@contextmanager
def _serve_proxy() -> Iterator[AgentServer]:
    """The flowtrial proxy (shaping on: PROXY_STUDY) over the simulated model, in-process
    behind a request log so the generic agent tests can check the traffic too."""
    from flowtrial.instrumentation.proxy.app import create_proxy_app
    from flowtrial.study.config import load_study
    from flowtrial.study.storage import open_db
    from tests.instrumentation.servers import run_asgi_server

    with tempfile.TemporaryDirectory(prefix="flowtrial-agents-") as tmp:
        study, db, key = _study_db(Path(tmp))
        database = open_db(db)
        log = RequestLog(create_proxy_app(database, load_study(study)))
        try:
            with run_asgi_server(log, timeout_graceful_shutdown=5) as base_url:
                yield AgentServer(base_url, key, log, _query(db))
        finally:
            database.dispose()


@contextmanager
def flowtrial_proxy(folder: Path, tool_steps: int = 0, script: tuple[str, ...] = ()
                    ) -> Iterator[tuple[str, str, Callable[[str], list[Any]]]]:
    """`flowtrial proxy` as users run it (a subprocess of the CLI) on PROXY_STUDY in
    ``folder`` (the simulated model taking ``tool_steps`` and saying ``script``): yields
    (base URL, participant key, SQL runner on its database)."""
    study, db, key = _study_db(folder, tool_steps, script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.cli", "proxy", "--study", str(study), "--db", str(db),
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    url = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and url is None:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        if m := re.match(r"ANTHROPIC_BASE_URL=(\S+)", line):
            url = m.group(1)
    try:
        if url is None:
            proc.kill()
            pytest.fail(f"flowtrial proxy did not start:\n{proc.communicate()[1][-3000:]}")
        yield url, key, _query(db)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


# What the agents can be pointed at: the bare simulated model, and the flowtrial proxy
# (shaping on) in front of it.
SERVERS: dict[str, Callable[[], AbstractContextManager[AgentServer]]] = {
    "mock": _serve_mock,
    "proxy": _serve_proxy,
}


def agent_binary(name: str) -> Path:
    """An installed agent; skips when node is absent, fails when the packages are missing."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the real-agent tests need Node.js and "
                    "`npm install --prefix tests/agents`")
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `npm install --prefix tests/agents` to install the "
                    "pinned Codex CLI, Claude Code and Gemini CLI", pytrace=False)
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
