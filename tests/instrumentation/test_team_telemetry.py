"""A team study without a proxy (``design = "observe"``): the OTLP receiver takes everyone's
telemetry with one team token, keeps each person under a salted pseudonym (never the raw
identity), and the team analysis rebuilds turns and waits from that telemetry alone."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from flowtrial.analysis.team import TeamQuery, team_agents, team_weekly
from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.study.config import parse_study
from flowtrial.study.storage import Database, init_db
from flowtrial.study.team import issue_team_token, pseudonym
from tests.instrumentation.otlp_payloads import claude_log, kvs, log, logs_request

pytestmark = pytest.mark.both_backends

OBSERVE = """
[study]
name = "team-observe"
design = "observe"
idle_limit_s = 600

[upstream]
kind = "mock"
"""
T0 = 1_767_600_000 * 1_000_000_000  # Monday 2026-01-05 08:00 UTC
S = 1_000_000_000


def observe_study(new_db: Callable[[str], str | Path]) -> tuple[Database, object, str | Path]:
    config = parse_study(tomllib.loads(OBSERVE))
    where = new_db("team.db")
    return init_db(where, config, OBSERVE), config, where


@pytest.fixture
def served(new_db: Callable[[str], str | Path]) -> Iterator[tuple[Database, str, httpx.Client]]:
    db, config, where = observe_study(new_db)
    token = issue_team_token(db)
    with serve_proxy(where, config) as px, httpx.Client(base_url=px.base_url) as http:
        yield db, token, http
    db.dispose()


def claude_turn(t0: int, email: str, wait_s: float, calls: int = 2,
                tool_s: float = 1.0) -> list:
    """One Claude Code turn: prompt at t0, ``calls`` model requests and a tool run between
    them, the last request ending ``wait_s`` after the prompt."""
    ident = {"user.email": email, "user.account_uuid": f"uuid-{email}"}
    recs = [claude_log("user_prompt", t0, {**ident, "prompt_length": "9", "prompt.id": "x"})]
    step = wait_s / calls
    for i in range(calls):
        end = t0 + round((i + 1) * step * S)
        recs.append(claude_log("api_request", end, {
            **ident, "model": "claude-sonnet-4", "duration_ms": str(round(step * 800)),
            "input_tokens": 10, "output_tokens": 5}))
        if i < calls - 1:
            recs.append(claude_log("tool_result", end + round(tool_s * S), {
                **ident, "tool_name": "Bash", "success": "true",
                "duration_ms": str(round(tool_s * 1000))}))
    return recs


def post(http: httpx.Client, token: str, req: object) -> httpx.Response:
    return http.post("/flowtrial/otlp/v1/logs", content=req.SerializeToString(),  # type: ignore[attr-defined]
                     headers={"authorization": f"Bearer {token}",
                              "content-type": "application/x-protobuf"})


def test_team_token_pseudonyms_and_turns_from_telemetry_alone(served) -> None:
    db, token, http = served
    ada, bob = "ada.lovelace@example.com", "bob.babbage@example.com"
    recs = [*claude_turn(T0, ada, 12.0), *claude_turn(T0 + 120 * S, ada, 30.0, calls=3),
            *claude_turn(T0 + 60 * S, bob, 5.0, calls=1)]
    req = logs_request(recs, service="claude-code")
    named = req.resource_logs[0].resource.attributes
    assert post(http, token, req).status_code == 200
    # Codex, from a person who opted in to show a name.
    codex = logs_request([
        log("codex.user_prompt", T0 + 300 * S, {"user.email": "cy@example.com",
                                                 "prompt_length": 4}),
        log("codex.api_request", T0 + 308 * S, {"user.email": "cy@example.com",
                                                 "model": "gpt-5", "duration_ms": "7000"}),
    ], service="codex")
    codex.resource_logs[0].resource.attributes.extend(kvs({"flowtrial.display_name": "Cy"}))
    assert post(http, token, codex).status_code == 200
    # A record naming no one is dropped and counted, OTLP's way (partial success).
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceResponse,
    )

    anon = post(http, token, logs_request([claude_log("user_prompt", T0, {})]))
    got = ExportLogsServiceResponse.FromString(anon.content).partial_success
    assert anon.status_code == 200 and got.rejected_log_records == 1
    assert "flowtrial.person" in got.error_message
    assert named is not None
    # A wrong token and a participant-style key without enrollment: 401, nothing written.
    before = db.engine.connect().execute(text("SELECT count(*) FROM events")).scalar_one()
    assert post(http, token[:-2] + "xx", req).status_code == 401
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == before
        people = dict(conn.execute(text("SELECT id, display_name FROM participants")).all())
        dump = "\n".join(str(r) for t in ("events", "participants", "meta")
                         for r in conn.execute(text(f"SELECT * FROM {t}")).all())  # noqa: S608
    secret = dict(db.engine.connect().execute(text(
        "SELECT key, value FROM meta WHERE key = 'team_pseudonym_secret'")).all())
    sec = secret["team_pseudonym_secret"]
    assert set(people) == {pseudonym(sec, ada), pseudonym(sec, bob),
                           pseudonym(sec, "cy@example.com")}
    assert people[pseudonym(sec, "cy@example.com")] == "Cy"
    for raw in ("example.com", "uuid-", "lovelace", "babbage"):  # identities never stored
        assert raw not in dump.lower(), raw

    with db.engine.connect() as conn:
        q = TeamQuery("telemetry", "person", dialect=db.engine.dialect.name)
        weekly = team_weekly(conn, q).set_index("who")
        agents = team_agents(conn, q).set_index("agent")
    a = weekly.loc[pseudonym(sec, ada)]
    assert a["waits"] == 2 and a["calls"] == 5 and a["week"] == "2026-01-05"
    assert a["mean_wait_s"] == pytest.approx((12.0 + 30.0) / 2)
    # Active time: 120 s to the next prompt (< idle limit), then the last wait alone.
    assert a["hours_active"] * 3600 == pytest.approx(120 + 30.0)
    assert a["waiting_share"] == pytest.approx(42.0 / 150.0)
    assert weekly.loc[pseudonym(sec, bob)]["mean_wait_s"] == pytest.approx(5.0)
    assert weekly.loc[pseudonym(sec, "cy@example.com")]["mean_wait_s"] == pytest.approx(8.0)
    # Unmeasured is never zero: no focus capture, no decisions.
    assert weekly["switches_per_hour"].isna().all()
    assert set(weekly["switch_reason"]) == {"no focus capture"}
    assert weekly["acceptance_rate"].isna().all()
    assert list(agents.index) == ["claude_code", "codex"]
    assert agents.loc["claude_code", "waits"] == 3 and agents.loc["claude_code", "people"] == 2
    assert agents.loc["codex", "model"] == "gpt-5"


def test_team_token_is_only_for_observe_studies(new_db) -> None:
    from flowtrial.study.team import TeamStudyError
    from tests.dashboards.conftest import parallel_text

    text_ = parallel_text()
    db = init_db(new_db("p.db"), parse_study(tomllib.loads(text_)), text_)
    with pytest.raises(TeamStudyError, match="observe"):
        issue_team_token(db)
    db.dispose()


def test_the_proxy_serves_otlp_grpc_when_configured(new_db) -> None:
    """`[proxy] otlp_grpc_port` starts the gRPC receiver with the proxy (its own threads)
    and stops it with it; the team token goes in the gRPC metadata."""
    grpc = pytest.importorskip("grpc", reason="needs grpcio")
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

    from flowtrial.instrumentation.proxy.extensions import AgentTelemetry, builtin_extensions

    text_ = OBSERVE + "\n[proxy]\notlp_grpc_port = 0\n"
    config = parse_study(tomllib.loads(text_))
    where = new_db("grpc.db")
    db = init_db(where, config, text_)
    token = issue_team_token(db)
    otel = next(e for e in builtin_extensions() if isinstance(e, AgentTelemetry))
    others = [e for e in builtin_extensions() if not isinstance(e, AgentTelemetry)]
    with serve_proxy(where, config, extensions=[*others, otel]):
        assert otel.grpc_port
        with grpc.insecure_channel(f"127.0.0.1:{otel.grpc_port}") as channel:
            stub = logs_service_pb2_grpc.LogsServiceStub(channel)
            req = logs_request(claude_turn(T0, "grace.hopper@example.com", 4.0, calls=1),
                               service="claude-code")
            stub.Export(req, metadata=[("authorization", f"Bearer {token}")], timeout=30)
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(req, metadata=[("authorization", "Bearer nope")], timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with db.engine.connect() as conn:
        weekly = team_weekly(conn, TeamQuery("telemetry", dialect=db.engine.dialect.name))
    assert len(weekly) == 1 and weekly["mean_wait_s"].iloc[0] == pytest.approx(4.0)
    with pytest.raises(grpc.RpcError):  # stopped with the proxy
        with grpc.insecure_channel(f"127.0.0.1:{otel.grpc_port}") as channel:
            logs_service_pb2_grpc.LogsServiceStub(channel).Export(req, timeout=2)
    db.dispose()


def test_import_otel_into_a_team_study_strips_identity_and_builds_turns(
        new_db, tmp_path: Path) -> None:
    from google.protobuf import json_format

    from flowtrial.instrumentation.telemetry.importer import import_otel
    from flowtrial.study.team import ensure_members

    db, _config, _ = observe_study(new_db)
    ensure_members(db, {"t-0000000000000001": None})
    req = logs_request(claude_turn(T0, "alan.turing@example.com", 6.0, calls=2),
                       service="claude-code")
    path = tmp_path / "otel.json"
    path.write_text(json_format.MessageToJson(req))
    import_otel(db, "t-0000000000000001", path)
    with db.engine.connect() as conn:
        dump = "\n".join(str(r) for r in conn.execute(text("SELECT * FROM events")).all())
        turns = conn.execute(text("SELECT wait_ns, calls FROM team_turns")).all()
    assert "turing" not in dump and "example.com" not in dump
    assert len(turns) == 1 and turns[0][0] / S == pytest.approx(6.0) and turns[0][1] == 2
    db.dispose()
