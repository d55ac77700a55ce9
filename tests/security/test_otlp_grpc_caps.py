"""OTLP over gRPC inside the proxy (issue #28) meets every check the HTTP receiver does, by
the same code (:class:`~flowtrial.instrumentation.telemetry.receiver.OtlpReceiver`): records
per post (partial success), long values fingerprinted, times refused by name, content = "none",
consent, the daily quota, and the health counters. The official gRPC stub on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.study.participation import withdraw

from .conftest import make_study
from .test_ingest_caps import CAPS, _logs, _otel_rows

grpc = pytest.importorskip("grpc", reason="needs grpcio")


def test_otlp_grpc_in_the_proxy_meets_the_caps(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

    from flowtrial.instrumentation.proxy.extensions import AgentTelemetry, builtin_extensions

    study = make_study(tmp_path, {**CAPS, "proxy": {**CAPS["proxy"], "otlp_grpc_port": 0}})
    otel = next(e for e in builtin_extensions() if isinstance(e, AgentTelemetry))
    others = [e for e in builtin_extensions() if not isinstance(e, AgentTelemetry)]
    app = create_proxy_app(study.database, study.config, extensions=[*others, otel])
    with TestClient(app) as client, \
            grpc.insecure_channel(f"127.0.0.1:{otel.grpc_port}") as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)

        def export(req: object, pid: str = "p01") -> object:
            return stub.Export(req, metadata=[("authorization",
                                               f"Bearer {study.keys[pid]}")], timeout=60)

        def health() -> dict[str, int]:
            return client.get("/flowtrial/v1/health").json()

        before = health()
        # 25 records, a cap of 10: 10 stored, 15 reported rejected (the exporter won't retry).
        out = export(_logs(25, {"prompt": "secret prompt", "note": "y" * 2000}))
        assert out.partial_success.rejected_log_records == 15
        assert "max_records_per_post" in out.partial_success.error_message
        rows = [json.loads(p) for (p,) in _otel_rows(study)]
        assert len(rows) == 10
        text = json.dumps(rows)
        assert "secret prompt" not in text  # content = "none": the prompt is not stored
        assert "y" * 300 not in text  # a long value: fingerprinted, not stored
        assert all(r["attributes"]["note"]["chars"] == 2000 for r in rows)
        # A time beyond 2100: refused by name, nothing written.
        with pytest.raises(grpc.RpcError) as err:
            export(_logs(1, t_ns=5_000_000_000_000_000_000))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "timeUnixNano" in err.value.details()
        assert len(_otel_rows(study)) == 10
        # Consent: a withdrawn participant is refused.
        withdraw(study.database, "p02")
        app.state.proxy.auth.refresh()
        with pytest.raises(grpc.RpcError) as err:
            export(_logs(1), "p02")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The day's quota (40,000 bytes) runs out: RESOURCE_EXHAUSTED, named.
        codes = []
        for _ in range(40):
            try:
                export(_logs(10, {"note": "z" * 250}))
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
                assert "max_stored_bytes_per_day" in exc.details()
                break
        assert codes[-1] == "RESOURCE_EXHAUSTED", codes
        size = study.rows("SELECT SUM(LENGTH(payload_json)) + 128 * COUNT(*) FROM events")[0][0]
        assert size <= 40_000
        # Counted like every other way in: each export a request, each refusal an error.
        after = health()
        n = 3 + len(codes)
        assert after["requests"] - before["requests"] == n
        assert after["errors"] - before["errors"] == 3  # range, withdrawn, quota
