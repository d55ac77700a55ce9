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
from contextlib import contextmanager
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


@contextmanager
def _cli_proxy(folder: Path, text: str, participant: str | None = None
               ) -> Iterator[tuple[str, str, Path]]:
    """`flowtrial proxy` as users run it on the study ``text`` in ``folder``: (URL, the key
    to send — the enrolled participant's, or a new team token for an observe study, db)."""
    from flowtrial.study.config import parse_study
    from flowtrial.study.participants import enroll
    from flowtrial.study.storage import init_db
    from flowtrial.study.team import issue_team_token

    folder.mkdir(exist_ok=True)
    study, db = folder / "study.toml", folder / "study.db"
    study.write_text(text)
    config = parse_study(tomllib.loads(text))
    database = init_db(db, config, text)
    key = (enroll(database, config, participant)[1] if participant
           else issue_team_token(database))
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
        # A study with arms prints the model URLs; an observe study its telemetry endpoint.
        if m := re.match(r"ANTHROPIC_BASE_URL=(\S+)", line):
            url = m.group(1)
        elif m := re.match(r"OTEL_EXPORTER_OTLP_ENDPOINT=(\S+)/flowtrial/otlp", line):
            url = m.group(1)
    try:
        if url is None:
            pytest.fail(f"flowtrial proxy did not start: {proc.communicate()[1][-2000:]}")
        yield url, key, db
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """`flowtrial proxy` on an observe study (as a team runs it): (URL, team token, db)."""
    with _cli_proxy(tmp_path / "team", OBSERVE) as served:
        yield served


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
    # The team view a lead opens, in Chromium: the two people's turns and waits.
    from tests.dashboards.test_browser import page_in_chromium

    text = page_in_chromium(db, "team", "Team view", "team-view-real-agents")
    assert re.search(r"Turns\s+2\s+People\s+2", text), text[:2000]
    assert "observational" in text  # the agents' table (a canvas grid: not in the text)
    assert "no focus capture" in text


def _team_tables(db: Path | str) -> tuple[Any, Any]:
    from flowtrial.analysis.team import TeamQuery, reconcile, team_weekly
    from flowtrial.study.storage import open_db

    database = open_db(db)
    try:
        with database.engine.connect() as conn:
            return (reconcile(conn, TeamQuery("telemetry")),
                    team_weekly(conn, TeamQuery("telemetry", "person")))
    finally:
        database.dispose()


def _wait_for_turns(db: Path, n: int, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        rec, weekly = _team_tables(db)
        if (len(rec) >= n and rec["proxy_turn_id"].notna().sum() >= n) \
                or time.monotonic() > deadline:
            return rec, weekly
        time.sleep(0.3)


#: Per turn, the telemetry's span (first request's start → the end of the last request, the
#: agent's own clock) minus the proxy's wait (first request → last token sent). Both clocks
#: are on one machine; what differs is where each stops the watch (the agent after parsing
#: the stream, the proxy at its last write): measured 0.09–0.15 s here (0.04–0.14 s across runs).
SAME_RUN_TOLERANCE_S = 0.5
#: The same turn run again without the proxy (the simulated model at the arm's pace directly):
#: agents' own overheads vary from run to run on a loaded 2-core machine.
CROSS_RUN_TOLERANCE_S = 1.5
ANSWER = 400  # tokens: a 1.3 s answer at the arm's 400 tokens/s after its 300 ms TTFT


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_telemetry_turns_agree_with_the_proxys(
        agent: str, claude_bin: Path, codex_bin: Path, workdir: Path,
        agent_env: dict[str, str], tmp_path: Path,
        receiver: tuple[str, str, Path]) -> None:
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app
    from tests.agents.harness import PROXY_STUDY, TARGET_TTFT_MS
    from tests.instrumentation.servers import run_asgi_server

    def run(model_url: str, model_key: str, otel_url: str, otel_key: str,
            home: Path) -> None:
        home.mkdir()
        if agent == "claude":
            env = (agent_env | claude_env(model_url, model_key)
                   | claude_telemetry_env(otel_url, otel_key)
                   | {"OTEL_RESOURCE_ATTRIBUTES": "flowtrial.person=ada@example.com"})
            cmd: list[str | Path] = [claude_bin, "-p", PROMPT, "--model", MODEL,
                                     "--no-session-persistence"]
        else:
            config = codex_config(model_url + "/v1") | {"otel": codex_otel(otel_url, otel_key)}
            (home / "config.toml").write_text(to_toml(config))
            env = agent_env | {"CODEX_HOME": str(home), KEY_ENV: model_key,
                               "OTEL_RESOURCE_ATTRIBUTES": "flowtrial.person=ada@example.com"}
            cmd = _codex_command(codex_bin, workdir)
        result = run_agent(cmd, env, workdir)
        assert result.returncode == 0, result.stderr[-2000:]

    # 1. The proxy in the path (shaped arm: 300 ms TTFT, 400 tokens/s), telemetry to it too.
    # Answers of a fixed length: the simulated model draws an answer per request, and the
    # agents' requests differ from run to run (ids, dates), so the two runs wait alike.
    text = PROXY_STUDY.replace("[upstream.mock]", f"[upstream.mock]\nanswer_tokens = {ANSWER}")
    with _cli_proxy(tmp_path / "proxied", text, "p01") as (url, key, pdb):
        run(url, key, url, key, tmp_path / "home1")
        rec, _ = _wait_for_turns(pdb, 1)
    assert len(rec) >= 1 and rec["proxy_turn_id"].notna().all(), rec
    assert (rec["diff_s"].abs() <= SAME_RUN_TOLERANCE_S).all(), rec.to_string()
    # 2. No proxy: the simulated model at the arm's pace, only telemetry to flowtrial.
    url2, token, db = receiver
    pace = MockModel(ttft_ms=TARGET_TTFT_MS, tokens_per_second=400,
                     answer_tokens=(ANSWER, ANSWER))
    with run_asgi_server(create_mock_app(pace)) as model_url:
        run(model_url, "ft_not-a-key", url2, token, tmp_path / "home2")
    _, weekly = _wait_for_turns(db, 0)
    deadline = time.monotonic() + 20
    while weekly.empty and time.monotonic() < deadline:
        time.sleep(0.3)
        _, weekly = _team_tables(db)
    assert int(weekly["waits"].sum()) == len(rec)  # the same number of turns
    direct, _ = _team_tables(db)
    gap = direct["telemetry_span_s"].to_numpy() - rec["proxy_wait_s"].to_numpy()
    print(f"\n{agent}: proxy wait {list(rec['proxy_wait_s'].round(3))} s, telemetry span "
          f"same run {list(rec['telemetry_span_s'].round(3))} s (diff "
          f"{list(rec['diff_s'].round(3))}), direct run {list(direct['telemetry_span_s'].round(3))}"
          f" s (vs proxy {list(gap.round(3))}), telemetry wait incl. prompt "
          f"{list(direct['telemetry_wait_s'].round(3))} s")
    assert (abs(gap) <= CROSS_RUN_TOLERANCE_S).all()
