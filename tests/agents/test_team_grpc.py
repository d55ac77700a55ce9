"""The OTLP/gRPC receiver with the real Claude Code's gRPC exporter (its
`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`): a team study's telemetry over gRPC, team token in the
metadata, turns rebuilt like over HTTP; a wrong token is UNAUTHENTICATED."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import pytest

from tests.agents.agent_configs import MODEL, claude_env, claude_telemetry_env
from tests.agents.harness import SERVERS, run_agent
from tests.agents.test_agents_mock import PROMPT

grpc = pytest.importorskip("grpc", reason="needs grpcio")
OBSERVE = ('[study]\nname = "team"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'
           '[proxy]\notlp_grpc_port = 0\n')


def test_claude_code_over_otlp_grpc_with_the_team_token(
        claude_bin: Path, workdir: Path, agent_env: dict[str, str], tmp_path: Path) -> None:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

    from flowtrial.analysis.team import TeamQuery, team_weekly
    from flowtrial.instrumentation.telemetry.grpc_receiver import serve_otlp_grpc
    from flowtrial.study.config import parse_study
    from flowtrial.study.storage import init_db
    from flowtrial.study.team import issue_team_token

    config = parse_study(tomllib.loads(OBSERVE))
    db = init_db(tmp_path / "team.db", config, OBSERVE)
    token = issue_team_token(db)
    server, port = serve_otlp_grpc(db, config, "127.0.0.1", 0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = logs_service_pb2_grpc.LogsServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(logs_service_pb2.ExportLogsServiceRequest(),
                            metadata=[("authorization", "Bearer ft_wrong_token")])
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with SERVERS["mock"]() as model:
            env = (agent_env | claude_env(model.base_url, model.key)
                   | claude_telemetry_env(f"http://127.0.0.1:{port}", token, protocol="grpc")
                   | {"OTEL_RESOURCE_ATTRIBUTES": "flowtrial.person=ada@example.com"})
            result = run_agent([claude_bin, "-p", PROMPT, "--model", MODEL,
                                "--no-session-persistence"], env, workdir)
        assert result.returncode == 0, result.stderr[-2000:]
        deadline = time.monotonic() + 20
        while True:
            with db.engine.connect() as conn:
                weekly = team_weekly(conn, TeamQuery("telemetry", "person"))
            if len(weekly) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(weekly) == 1 and int(weekly["waits"].iloc[0]) == 1, weekly
        assert weekly["who"].iloc[0].startswith("t-") and weekly["mean_wait_s"].iloc[0] > 0
    finally:
        server.stop(1).wait()
        db.dispose()
