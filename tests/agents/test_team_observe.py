"""Done-when of the team flow: a team study fed only by the real agents' telemetry. Claude
Code (`-p`) and Codex (`exec`) talk to the simulated model directly (no proxy in the path);
their OpenTelemetry goes to `flowtrial proxy` serving an observe study, with one team token;
each person arrives as a pseudonym and the team analysis finds their turns and waits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.agent_configs import (
    KEY_ENV,
    MODEL,
    claude_env,
    claude_telemetry_env,
    codex_config,
    codex_otel,
    to_toml,
)
from tests.agents.harness import SERVERS, run_agent
from tests.agents.test_agents_mock import PROMPT, _codex_command

pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")
ROOT = Path(__file__).resolve().parents[2]
OBSERVE = '[study]\nname = "team"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """`flowtrial proxy` on an observe study (as a team runs it): (URL, team token, db)."""
    from flowtrial.study.config import parse_study
    from flowtrial.study.storage import init_db
    from flowtrial.study.team import issue_team_token

    study, db = tmp_path / "team.toml", tmp_path / "team.db"
    study.write_text(OBSERVE)
    database = init_db(db, parse_study(tomllib.loads(OBSERVE)), OBSERVE)
    token = issue_team_token(database)
    database.dispose()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.cli", "proxy", "--study", str(study), "--db",
         str(db), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, start_new_session=True)
    assert proc.stdout is not None
    url = None
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        if m := re.match(r"ANTHROPIC_BASE_URL=(\S+)", line):
            url = m.group(1)
    try:
        if url is None:
            pytest.fail(f"flowtrial proxy did not start: {proc.communicate()[1][-2000:]}")
        yield url, token, db
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _weekly(db: Path, want_people: int, timeout_s: float = 20.0) -> Any:
    from flowtrial.analysis.team import TeamQuery, team_agents, team_weekly
    from flowtrial.study.storage import open_db

    database = open_db(db)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with database.engine.connect() as conn:
                weekly = team_weekly(conn, TeamQuery("telemetry", "person"))
                agents = team_agents(conn, TeamQuery("telemetry", "person"))
            if len(weekly) >= want_people or time.monotonic() > deadline:
                return weekly, agents
            time.sleep(0.3)
    finally:
        database.dispose()


def test_claude_code_and_codex_telemetry_alone_make_a_team_view(
        claude_bin: Path, codex_bin: Path, workdir: Path, agent_env: dict[str, str],
        tmp_path: Path, receiver: tuple[str, str, Path]) -> None:
    url, token, db = receiver
    with SERVERS["mock"]() as model:
        claude = (agent_env | claude_env(model.base_url, model.key)
                  | claude_telemetry_env(url, token)
                  | {"OTEL_RESOURCE_ATTRIBUTES": "flowtrial.person=ada@example.com"})
        r1 = run_agent([claude_bin, "-p", PROMPT, "--model", MODEL,
                        "--no-session-persistence"], claude, workdir)
        home = tmp_path / "codex_home"
        home.mkdir()
        config = codex_config(model.openai_base_url) | {"otel": codex_otel(url, token)}
        (home / "config.toml").write_text(to_toml(config))
        codex = agent_env | {"CODEX_HOME": str(home), KEY_ENV: model.key,
                             "OTEL_RESOURCE_ATTRIBUTES": "flowtrial.person=bob@example.com"}
        r2 = run_agent(_codex_command(codex_bin, workdir), codex, workdir)
    assert r1.returncode == 0, r1.stderr[-2000:]
    assert r2.returncode == 0, r2.stderr[-2000:]
    weekly, agents = _weekly(db, 2)
    assert len(weekly) == 2, weekly  # two people, each under a pseudonym
    assert all(w.startswith("t-") for w in weekly["who"])
    assert (weekly["waits"] == 1).all() and (weekly["calls"] >= 1).all()
    assert (weekly["mean_wait_s"] > 0).all() and (weekly["mean_wait_s"] < 120).all()
    assert set(agents["agent"]) == {"claude_code", "codex"}
    assert weekly["switches_per_hour"].isna().all()  # no focus capture: "—", not 0
    assert b"example.com" not in db.read_bytes()
