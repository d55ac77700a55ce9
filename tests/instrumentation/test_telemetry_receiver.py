"""The OTLP/HTTP receiver on the proxy: agents' telemetry mapped, linked to cycles, written
once; errors in OTLP's own shape with nothing written."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2

from flowtrial.instrumentation.proxy import serve_proxy
from tests.instrumentation.otlp_payloads import (
    claude_log,
    gemini_log,
    log,
    logs_request,
    metric_request,
    span_request,
)

pytestmark = pytest.mark.both_backends

MODEL = "flowtrial-sim-1"
PROTO = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    s = make_study_module({"proxy": {"max_body_bytes": 65536}}, participants=("p01", "p02"))
    with serve_proxy(s.db, s.config) as px, httpx.Client(base_url=px.base_url) as http:
        yield s, px, http


def auth(key: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **extra}


def a_cycle(s, px, key: str) -> tuple[str, int, int]:
    """One chat cycle: (id, wall start ns, wall end ns)."""
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=key, max_retries=0)
    r = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    cid = r.headers["x-flowtrial-cycle-id"]
    for _ in range(200):  # the row is written just after the answer
        got = s.rows("SELECT wall_anchor_ns + t_request_ns - mono_anchor_ns, wall_anchor_ns + "
                     "COALESCE(t_done_ns, t_last_sent_ns) - mono_anchor_ns FROM cycles "
                     "WHERE id = :c", {"c": cid})
        if got:
            return cid, int(got[0][0]), int(got[0][1])
        px.state  # noqa: B018 - keep polling
        import time
        time.sleep(0.01)
    raise AssertionError("cycle not recorded")


def events(s, since: int = 0) -> list[Any]:
    return s.rows("SELECT id, kind, cycle_id, ts_ns, duration_s, source, payload_json, "
                  "participant_id FROM events WHERE id > :i ORDER BY id", {"i": since})


def last_id(s) -> int:
    return int(s.rows("SELECT COALESCE(max(id), 0) FROM events")[0][0])


def test_claude_code_logs_over_protobuf_are_mapped_and_linked(served) -> None:
    s, px, http = served
    cid, start, end = a_cycle(s, px, s.keys["p01"])
    before = last_id(s)
    req = logs_request([
        claude_log("user_prompt", start - 50_000_000,
                   {"prompt_length": "12", "prompt": "secret words", "prompt.id": "p-1"}),
        claude_log("api_request", end + 2_000_000,
                   {"model": MODEL, "duration_ms": str((end - start) // 1_000_000),
                    "input_tokens": 10, "output_tokens": 5, "request_id": "req_x"}),
        claude_log("tool_decision", end + 900_000_000,
                   {"decision": "accept", "source": "user_temporary", "tool_name": "Bash",
                    "tool_use_id": "toolu_1"}),
        claude_log("tool_decision", end + 950_000_000,
                   {"decision": "reject", "source": "user_abort", "tool_name": "Write",
                    "tool_use_id": "toolu_2"}),
        claude_log("tool_result", end + 1_500_000_000,
                   {"tool_name": "Bash", "tool_use_id": "toolu_1", "success": "true",
                    "duration_ms": "420"}),
        claude_log("hook_execution_start", end + 1_600_000_000, {"hook_event": "Stop"}),
    ], service="claude-code")
    body = req.SerializeToString()
    r = http.post("/flowtrial/otlp/v1/logs", content=body, headers=auth(s.keys["p01"], **PROTO))
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    rows = events(s, before)
    assert [r_[1] for r_ in rows] == ["turn_start", "api_request", "accept", "reject",
                                      "tool_result", "custom"]
    assert {r_[5] for r_ in rows} == {"otel"} and {r_[7] for r_ in rows} == {"p01"}
    assert all(r_[2] == cid for r_ in rows[:5]), rows  # every mapped event on that cycle
    payloads = [json.loads(r_[6]) for r_ in rows]
    assert "prompt" not in payloads[0] and payloads[0]["prompt_length"] == 12  # fingerprint
    assert "secret" not in "".join(r_[6] for r_ in rows)
    assert payloads[2]["decided_by"] == "person" and payloads[2]["source"] == "user_temporary"
    assert payloads[3]["source"] == "user_abort" and payloads[3]["tool"] == "Write"
    assert rows[4][4] == pytest.approx(0.42)
    assert payloads[5]["name"] == "claude_code.hook_execution_start"
    # An exporter's retry writes nothing twice.
    r = http.post("/flowtrial/otlp/v1/logs", content=body, headers=auth(s.keys["p01"], **PROTO))
    assert r.status_code == 200 and len(events(s, before)) == 6


def test_codex_logs_over_gzipped_json_are_mapped(served) -> None:
    s, px, http = served
    cid, start, end = a_cycle(s, px, s.keys["p02"])
    before = last_id(s)
    req = logs_request([
        log("codex.api_request", end, {"model": MODEL, "duration_ms": str(
            (end - start) // 1_000_000), "http.response.status_code": 200, "attempt": 1,
            "conversation.id": "c-1"}),
        log("codex.tool_decision", end + 10**9, {"decision": "approved_for_session",
            "source": "user", "tool_name": "shell", "call_id": "call_1", "model": MODEL}),
        log("codex.tool_decision", end + 2 * 10**9, {"decision": "denied",
            "source": "config", "tool_name": "shell", "call_id": "call_2"}),
    ], service="codex_exec")
    body = gzip.compress(json_format.MessageToJson(req).encode())
    # OTLP JSON writes ids as hex, not base64: the receiver reads them as OTLP says.
    data = json.loads(json_format.MessageToJson(req))
    rec0 = data["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    rec0["traceId"] = "5b8efff798038103d269b633813fc60c"
    body = gzip.compress(json.dumps(data).encode())
    r = http.post("/flowtrial/otlp/v1/logs", content=body,
                  headers=auth(s.keys["p02"], **JSON, **{"content-encoding": "gzip"}))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json" and r.json() == {}
    rows = events(s, before)
    assert [(x[1], x[2]) for x in rows] == [("api_request", cid), ("accept", cid),
                                           ("reject", cid)]
    p = [json.loads(x[6]) for x in rows]
    assert (p[1]["decided_by"], p[2]["decided_by"]) == ("person", "config")
    assert {x[7] for x in rows} == {"p02"}


def test_spans_and_metrics_are_kept(served) -> None:
    s, px, http = served
    cid, start, end = a_cycle(s, px, s.keys["p01"])
    before = last_id(s)
    span = span_request("claude_code.tool.blocked_on_user", end + 10**8, end + 3 * 10**9,
                        {"span.type": "tool.blocked_on_user", "duration_ms": 2900,
                         "decision": "accept", "source": "user_temporary"})
    r = http.post("/flowtrial/otlp/v1/traces", content=span.SerializeToString(),
                  headers=auth(s.keys["p01"], **PROTO))
    assert r.status_code == 200
    # The same span around a check a rule answered (no one asked) is not a wait for anyone.
    ruled = span_request("claude_code.tool.blocked_on_user", end + 10**8, end + 10**8 + 10**6,
                         {"span.type": "tool.blocked_on_user", "decision": "unknown",
                          "source": "unknown"})
    r = http.post("/flowtrial/otlp/v1/traces", content=ruled.SerializeToString(),
                  headers=auth(s.keys["p01"], **PROTO))
    assert r.status_code == 200
    metric = metric_request("claude_code.session.count", end, 1)
    r = http.post("/flowtrial/otlp/v1/metrics", content=json_format.MessageToJson(metric),
                  headers=auth(s.keys["p01"], **JSON))
    assert r.status_code == 200
    rows = events(s, before)
    assert [(x[1], x[2]) for x in rows] == [("agent_wait", cid), ("custom", None),
                                           ("custom", None)]
    assert rows[0][4] == pytest.approx(2.9)
    assert json.loads(rows[1][6])["name"] == "claude_code.tool.blocked_on_user"
    assert json.loads(rows[2][6])["attributes"]["metric.value"] == 1


@pytest.mark.parametrize("headers", [PROTO, JSON])
def test_no_key_is_401_in_otlp_shape(served, headers: dict[str, str]) -> None:
    s, _, http = served
    before = last_id(s)
    for h in ({}, {"authorization": "Bearer ft_not_a_key"}):
        r = http.post("/flowtrial/otlp/v1/logs", content=b"", headers={**headers, **h})
        assert r.status_code == 401
        if headers is JSON:
            st = json_format.Parse(r.text, status_pb2.Status())
        else:
            st = status_pb2.Status.FromString(r.content)
        assert st.code == code_pb2.UNAUTHENTICATED and "participant key" in st.message
    assert last_id(s) == before


@pytest.mark.parametrize(("body", "headers"), [
    (b"\xff\xff\xff garbage", PROTO),
    (b"{not json", JSON),
    (b'{"resourceLogs": 5}', JSON),
    (b'[1, 2]', JSON),
    (gzip.compress(b"\x0a\xff\xff\xff"), {**PROTO, "content-encoding": "gzip"}),
    (b"not gzip", {**PROTO, "content-encoding": "gzip"}),
    (gzip.compress(logs_request([log("codex.x", 1, {})]).SerializeToString())[:-12],
     {**PROTO, "content-encoding": "gzip"}),  # cut off
    (b"x", {"content-type": "text/plain"}),
])
def test_malformed_bodies_are_400_and_nothing_written(served, body: bytes,
                                                      headers: dict[str, str]) -> None:
    s, _, http = served
    before = last_id(s)
    r = http.post("/flowtrial/otlp/v1/logs", content=body, headers=auth(s.keys["p01"], **headers))
    assert r.status_code == 400, r.text
    if headers.get("content-type") == "application/json":
        st = json_format.Parse(r.text, status_pb2.Status())
    else:
        st = status_pb2.Status.FromString(r.content)
    assert st.code == code_pb2.INVALID_ARGUMENT and st.message
    assert last_id(s) == before


def test_prompt_text_kept_only_with_full_capture(make_study) -> None:
    s = make_study({"capture": {"content": "full"}})
    req = logs_request([gemini_log("user_prompt", 1_795_000_000_000_000_000,
                                   {"prompt_length": 5, "prompt": "hello", "prompt_id": "x"})])
    with serve_proxy(s.db, s.config) as px, httpx.Client(base_url=px.base_url) as http:
        r = http.post("/flowtrial/otlp/v1/logs", content=req.SerializeToString(),
                      headers=auth(s.key, **PROTO))
    assert r.status_code == 200
    (payload,) = [json.loads(x[0]) for x in s.rows("SELECT payload_json FROM events")]
    assert payload["prompt"] == "hello" and payload["agent"] == "gemini_cli"


def test_body_over_the_limit_is_413_and_nothing_written(served) -> None:
    s, _, http = served
    before = last_id(s)
    r = http.post("/flowtrial/otlp/v1/traces", content=b"\x00" * 70_000,
                  headers=auth(s.keys["p01"], **PROTO))
    assert r.status_code == 413
    assert status_pb2.Status.FromString(r.content).code == code_pb2.RESOURCE_EXHAUSTED
    assert last_id(s) == before


def test_decisions_and_prompts_skip_side_calls() -> None:
    """Claude Code's interactive title request leaves with the prompt and ends after the
    answer that asked for a tool (seen with 2.1.197 in a terminal): the prompt and the
    decision belong to the turn's own calls, the side call keeps only its request timing."""
    from flowtrial.instrumentation.telemetry.ingest import CycleSpan, link_events
    from flowtrial.instrumentation.telemetry.mapped import MappedEvent

    s = 1_000_000_000
    cycles = [CycleSpan("cyc_side", "m", 10 * s, 14 * s, side=True),
              CycleSpan("cyc_tool", "m", 10 * s + s // 10, 12 * s)]
    events = [MappedEvent("turn_start", 10 * s - s // 10, {}, link="after"),
              MappedEvent("reject", 15 * s, {}, link="before"),
              MappedEvent("api_request", 14 * s, {}, 4.0, "request", "m", 10 * s)]
    link_events(events, cycles)
    assert [e.extra.get("cycle_id") for e in events] == ["cyc_tool", "cyc_tool", "cyc_side"]
