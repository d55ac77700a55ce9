"""Caps on uploads (issue #28): times by name, records per OTLP post (partial success),
inflated size, value size, the daily quota, content = "none" for telemetry — through the
proxy app with its ingest processes, the official OTLP protobuf messages on the wire."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from flowtrial.instrumentation.upload_caps import TRUNCATED_KEY, UploadCaps, cap_payload

from .conftest import bearer, make_study, proxy_client

LOGS = "/flowtrial/otlp/v1/logs"
CAPS = {"proxy": {"max_records_per_post": 10, "max_value_bytes": 256, "max_payload_bytes": 8192,
                  "max_stored_bytes_per_day": 40_000, "max_inflated_bytes": 1 << 20},
        "capture": {"content": "none"}}


def _logs(n: int, attrs: dict[str, str] | None = None, t_ns: int | None = None,
          name: str = "claude_code.custom_thing") -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    logs = req.resource_logs.add().scope_logs.add().log_records
    now = time.time_ns() if t_ns is None else t_ns
    for i in range(n):
        r = logs.add()
        r.time_unix_nano = now + i
        r.body.string_value = name
        for k, v in (attrs or {}).items():
            kv = r.attributes.add()
            kv.key = k
            kv.value.string_value = v
    return req


def _post(client: Any, key: str, req: ExportLogsServiceRequest) -> Any:
    return client.post(LOGS, content=req.SerializeToString(), headers={
        **bearer(key), "content-type": "application/x-protobuf"})


def _otel_rows(study: Any) -> list[tuple[str]]:
    return study.rows("SELECT payload_json FROM events WHERE source = 'otel'")


def test_otlp_caps(tmp_path: Path) -> None:
    study = make_study(tmp_path, CAPS)
    key = study.keys["p01"]
    with proxy_client(study) as client:
        # Records over max_records_per_post: stored up to the cap, the rest reported.
        r = _post(client, key, _logs(25))
        assert r.status_code == 200, r.text
        answer = ExportLogsServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_log_records == 15
        assert "max_records_per_post" in answer.partial_success.error_message
        assert len(_otel_rows(study)) == 10
        # A time in 2255 (9e18 ns) is refused by name; nothing written.
        r = _post(client, key, _logs(1, t_ns=9_000_000_000_000_000_000))
        assert r.status_code == 400
        assert "timeUnixNano" in status_pb2.Status.FromString(r.content).message
        # A timestamp beyond 64 bits (OTLP/JSON): the protocol's 400, not a 500.
        doc = json_format.MessageToDict(_logs(1))
        doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["timeUnixNano"] = str(2**70)
        r = client.post(LOGS, json=doc, headers=bearer(key))
        assert r.status_code == 400 and r.json()["message"]
        # A gzip bomb stops at max_inflated_bytes: 413 in OTLP's shape.
        bomb = gzip.compress(b"\0" * (8 << 20), 9)
        r = client.post(LOGS, content=bomb, headers={
            **bearer(key), "content-type": "application/x-protobuf",
            "content-encoding": "gzip"})
        assert r.status_code == 413
        assert "max_inflated_bytes" in status_pb2.Status.FromString(r.content).message
        assert len(_otel_rows(study)) == 10
        # content = "none": content keys dropped, other long strings fingerprinted.
        secret = "def leaked():\n    return 42\n" * 100
        r = _post(client, key, _logs(1, {"tool_input": secret, "note": secret,
                                         "short": "kept"}, name="claude_code.other"))
        assert r.status_code == 200
        payloads = [json.loads(p) for (p,) in _otel_rows(study)]
        last = max(payloads, key=lambda p: "note" in p.get("attributes", {}))
        assert "tool_input" not in last["attributes"]
        assert last["attributes"]["note"]["chars"] == len(secret)
        assert last["attributes"]["short"] == "kept"
        assert not any("leaked" in p for (p,) in _otel_rows(study))


def test_event_payloads_capped_and_daily_quota(tmp_path: Path) -> None:
    study = make_study(tmp_path, CAPS)
    key = study.keys["p01"]
    with proxy_client(study) as client:
        big = {"events": [{"kind": "custom", "payload": {"text": "x" * 10_000,
                                                         "items": list(range(50_000))}}]}
        r = client.post("/flowtrial/v1/events", json=big, headers=bearer(key))
        assert r.status_code == 200, r.text
        (stored,) = study.rows("SELECT payload_json FROM events")[0]
        payload = json.loads(stored)
        assert len(payload["text"]) == 256 and TRUNCATED_KEY in payload
        assert len(stored) < 8192 + 1024
        # Keep uploading: the day's 40,000 bytes run out; the refusal says so and when.
        statuses = []
        for _ in range(10):
            r = client.post("/flowtrial/v1/events", json=big, headers=bearer(key))
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "daily_quota"
                assert 0 < int(r.headers["retry-after"]) <= 86_401
                break
        assert statuses[-1] == 429
        n_before = study.count("events")
        size = study.rows("SELECT SUM(LENGTH(payload_json)) + 128 * COUNT(*) FROM events")[0][0]
        assert size <= 40_000
        # Another participant is not affected.
        r = client.post("/flowtrial/v1/events", json=big, headers=bearer(study.keys["p02"]))
        assert r.status_code == 200
        assert study.count("events") == n_before + 1


def test_cap_payload_flags_what_it_cut() -> None:
    caps = UploadCaps(max_value_bytes=64, max_payload_bytes=1024)
    out = cap_payload({"a": "é" * 100, "b": list(range(10_000)), "c": 1}, caps)
    assert len(out["a"].encode()) <= 64
    assert len(out["b"]) < 200
    cut = out[TRUNCATED_KEY]
    assert cut[0].startswith("a (200 bytes)") and any("more item" in c for c in cut)
    assert cap_payload({"a": "short"}, caps) == {"a": "short"}
