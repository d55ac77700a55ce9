"""`flowtrial import-otel`: OTLP JSON files (a collector's file exporter output) mapped with
the receiver's mapping — Gemini CLI's here, on payloads built with the opentelemetry-proto
classes — linked to cycles, idempotent, and refused whole when a line is bad."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from google.protobuf import json_format
from typer.testing import CliRunner

pytest.importorskip("opentelemetry.proto", reason="needs the [telemetry] extra")

from flowtrial.instrumentation.capture_commands import import_otel as import_command  # noqa: E402
from flowtrial.instrumentation.telemetry.otlp import parse_json_request, records  # noqa: E402
from tests.instrumentation.otlp_payloads import (  # noqa: E402
    gemini_log,
    logs_request,
    span_request,
)

pytestmark = pytest.mark.both_backends

NS = 1_000_000_000
T0 = 1_795_000_000 * NS  # 2026-11-18
MODEL = "gemini-2.5-pro"


def gemini_session() -> list[Any]:
    """A Gemini CLI turn: prompt, one model response, four tool calls with each decision."""
    tool = {"success": True, "tool_type": "native", "prompt_id": "p#1"}
    return [
        logs_request([gemini_log("user_prompt", T0, {"prompt_length": 18, "prompt_id": "p#1",
                                                     "prompt": "do not store this"})],
                     "gemini-cli"),
        logs_request([gemini_log("api_response", T0 + 3 * NS, {
            "model": MODEL, "duration_ms": 2900, "input_token_count": 100,
            "output_token_count": 40, "status_code": 200, "prompt_id": "p#1"})], "gemini-cli"),
        logs_request([
            gemini_log("tool_call", T0 + 5 * NS, {**tool, "function_name": "read_file",
                                                  "decision": "auto_accept",
                                                  "duration_ms": 30}),
            gemini_log("tool_call", T0 + 9 * NS, {**tool, "function_name": "run_shell_command",
                                                  "decision": "accept", "duration_ms": 1500}),
            gemini_log("tool_call", T0 + 12 * NS, {**tool, "function_name": "replace",
                                                   "decision": "modify", "duration_ms": 80}),
            gemini_log("tool_call", T0 + 14 * NS, {**tool, "function_name": "write_file",
                                                   "decision": "reject", "duration_ms": 0,
                                                   "success": False}),
            gemini_log("slash_command", T0 + 20 * NS, {"command": "stats"}),
        ], "gemini-cli"),
    ]


#: What :func:`gemini_session` maps to (kind, linked cycle), in time order, its one unknown
#: record (a ``custom`` event) left out.
SESSION_LINKS = [
    ("turn_start", "cyc_turn"), ("api_request", "cyc_turn"),
    *[(kind, "cyc_turn") for decision in ("accept", "accept", "partial_accept", "reject")
      for kind in (decision, "tool_result")],
]


def write_jsonl(path: Path, requests: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(json_format.MessageToDict(r)) for r in requests) + "\n")
    return path


def cli(study: Any, participant: str, path: Path) -> Any:
    app = typer.Typer()
    app.command()(import_command)
    return CliRunner().invoke(app, ["--db", str(study.db), "--participant", participant,
                                    str(path)])


def otel_rows(study: Any) -> list[Any]:
    return study.rows("SELECT kind, cycle_id, ts_ns, duration_s, payload_json, source "
                      "FROM events ORDER BY ts_ns, kind")


def test_gemini_cli_session_is_mapped_linked_and_idempotent(tmp_path: Path,
                                                            make_study: Any) -> None:
    study = make_study()
    study.add_cycle("cyc_turn", "p01", T0 + 100_000_000, T0 + 3 * NS)  # the model request
    study.add_cycle("cyc_other", "p01", T0 + 60 * NS, T0 + 61 * NS)  # a later one
    path = write_jsonl(tmp_path / "gemini.jsonl", gemini_session())
    first = cli(study, "p01", path)
    assert first.exit_code == 0, first.output
    rows = otel_rows(study)
    got = [(r[0], r[1]) for r in rows]
    assert got == [*SESSION_LINKS, ("custom", None)]
    assert {r[5] for r in rows} == {"otel"}
    p = [json.loads(r[4]) for r in rows]
    decisions = [(x["decision"], x["decided_by"]) for x in p if "decided_by" in x]
    assert decisions == [("auto_accept", "config"), ("accept", "person"),
                         ("modify", "person"), ("reject", "person")]
    assert "prompt" not in p[0] and "do not store" not in "".join(r[4] for r in rows)
    assert rows[1][3] == pytest.approx(2.9) and p[1]["model"] == MODEL
    assert [r[3] for r in rows if r[0] == "tool_result"] == pytest.approx(
        [0.03, 1.5, 0.08, 0.0])
    assert p[-1]["name"] == "gemini_cli.slash_command" and p[-1]["agent"] == "gemini_cli"
    assert "11 new events, 10 linked" in " ".join(first.output.split())
    again = cli(study, "p01", path)
    assert again.exit_code == 0 and "0 new events" in " ".join(again.output.split())
    assert len(otel_rows(study)) == len(rows)


def test_one_bad_line_refuses_the_whole_file(tmp_path: Path, make_study: Any) -> None:
    study = make_study()
    path = write_jsonl(tmp_path / "bad.jsonl", gemini_session())
    path.write_text(path.read_text() + '{"resourceLogs": [{"scopeLogs": 7}]}\n')
    r = cli(study, "p01", path)
    assert r.exit_code == 2 and "bad.jsonl:4" in " ".join(r.output.split())
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"resourceLogs": []}\nnot json\n')
    r = cli(study, "p01", junk)
    assert r.exit_code == 2 and "junk.jsonl:2: not JSON" in " ".join(r.output.split())
    r = cli(study, "nobody", write_jsonl(tmp_path / "ok.jsonl", gemini_session()))
    assert r.exit_code == 2 and "no participant 'nobody'" in " ".join(r.output.split())
    assert otel_rows(study) == []


def test_a_record_has_one_digest_in_json_and_protobuf() -> None:
    """A record imported from a file after it arrived live is the same row."""
    for req, signal in ((gemini_session()[2], "logs"),
                        (span_request("claude_code.interaction", T0, T0 + NS, {"a": 1}),
                         "traces")):
        live = records(signal, req)  # type: ignore[arg-type]
        filed = records(signal, parse_json_request(signal, json_format.MessageToDict(req)))  # type: ignore[arg-type]
        assert [r.digest for r in live] == [r.digest for r in filed] and live


def _sdk_resource() -> dict[str, Any]:
    """A ``ResourceImpl`` (resources 2.7.1) as ``JSON.stringify`` writes it: its raw
    attribute pairs (Gemini CLI's, then the NodeSDK's detected ones; an unsettled async one
    written as ``{}``), and the memo once the exporter read them."""
    return {"_rawAttributes": [["service.name", "gemini-cli"], ["service.version", "v22.11.0"],
                               ["session.id", "s-1"], ["host.name", {}]],
            "_asyncAttributesPending": False}


def _sdk_log(time_ns: int, attrs: dict[str, Any], body: str) -> dict[str, Any]:
    """A ``LogRecordImpl`` (opentelemetry-js sdk-logs 0.218.0, the version Gemini CLI
    locks) as Gemini CLI's ``FileLogExporter`` serialises it: its own fields in the order
    the constructor sets them (undefined ones left out by ``JSON.stringify``, ``Infinity``
    written as ``null``), read-only once emitted."""
    hr = [time_ns // NS, time_ns % NS]
    return {"attributes": {"session.id": "s-1", "installation.id": "i-1",
                           "interactive": True, **attrs, "event.timestamp": "2026-11-18"},
            "_attributesCount": len(attrs) + 4, "_droppedAttributesCount": 0,
            "_isReadonly": True, "hrTime": hr, "hrTimeObserved": hr, "_body": body,
            "resource": _sdk_resource(),
            "instrumentationScope": {"name": "gemini-cli"},
            "_logRecordLimits": {"attributeCountLimit": 128, "attributeValueLengthLimit": None}}


def write_gemini_outfile(path: Path, requests: list[Any]) -> Path:
    """``requests`` (OTLP) as Gemini CLI's ``telemetry.outfile`` holds the same records:
    each ``safeJsonStringify(record, 2) + "\\n"`` (gemini-cli
    packages/core/src/telemetry/file-exporters.ts), a span and a metrics export between."""
    out = []
    for req in requests:
        for rec in records("logs", req):
            out.append(_sdk_log(rec.time_ns, {"event.name": rec.name, **rec.attributes},
                                str(rec.body)))
    out.insert(2, {  # a SpanImpl (sdk-trace-base 2.7.1), e.g. a tool call's span
        "attributes": {"gen_ai.operation.name": "execute_tool"}, "links": [], "events": [],
        "_droppedAttributesCount": 0, "_droppedEventsCount": 0, "_droppedLinksCount": 0,
        "_attributesCount": 1, "status": {"code": 0}, "endTime": [T0 // NS + 9, 0],
        "_ended": True, "_duration": [1, 500_000_000], "name": "tool_call",
        "_spanContext": {"traceId": "ab" * 16, "spanId": "cd" * 8, "traceFlags": 1},
        "kind": 0, "startTime": [T0 // NS + 7, 500_000_000], "resource": _sdk_resource(),
        "instrumentationScope": {"name": "gemini-cli"}, "_spanLimits": {}})
    out.append({"resource": _sdk_resource(), "scopeMetrics": [{  # a ResourceMetrics
        "scope": {"name": "gemini-cli"}, "metrics": [{
            "descriptor": {"name": "gemini_cli.tool.call.count", "type": "COUNTER",
                           "description": "Counts tool calls", "unit": "", "valueType": 0,
                           "advice": {}},
            "aggregationTemporality": 1, "dataPointType": 3, "dataPoints": [{
                "attributes": {"function_name": "read_file"},
                "startTime": [T0 // NS, 0], "endTime": [T0 // NS + 30, 0], "value": 4}]}]}]})
    path.write_text("".join(json.dumps(o, indent=2, ensure_ascii=False) + "\n" for o in out),
                    encoding="utf-8")
    return path


def test_gemini_cli_outfile_is_read_with_the_same_mapping(tmp_path: Path,
                                                          make_study: Any) -> None:
    """Gemini CLI's own outfile (not OTLP: the SDK's records, pretty-printed one after
    another) gives the rows its OTLP export gives; a span and a metric point are kept as
    custom events; importing it again adds nothing."""
    study = make_study()
    study.add_cycle("cyc_turn", "p01", T0 + 100_000_000, T0 + 3 * NS)
    path = write_gemini_outfile(tmp_path / "gemini-telemetry.log", gemini_session())
    assert path.read_text().startswith('{\n  "attributes": {\n    "session.id": ')
    first = cli(study, "p01", path)
    assert first.exit_code == 0, first.output
    rows = otel_rows(study)
    mapped = [(r[0], r[1]) for r in rows if r[0] != "custom"]
    assert mapped == SESSION_LINKS
    p = [json.loads(r[4]) for r in rows]
    assert [(x["decision"], x["decided_by"]) for x in p if "decided_by" in x] == [
        ("auto_accept", "config"), ("accept", "person"), ("modify", "person"),
        ("reject", "person")]
    assert rows[1][2] == T0 + 3 * NS and rows[1][3] == pytest.approx(2.9)
    assert "do not store" not in "".join(r[4] for r in rows)
    custom = sorted(x["name"] for x in p if x.get("signal"))
    assert custom == ["gemini_cli.slash_command", "gemini_cli.tool.call.count", "tool_call"]
    span = next(r for r, x in zip(rows, p, strict=True) if x.get("name") == "tool_call")
    assert span[2] == T0 + 7 * NS + NS // 2 and span[3] == pytest.approx(1.5)
    assert "13 new events" in " ".join(first.output.split())
    again = cli(study, "p01", path)
    assert again.exit_code == 0 and "0 new events" in " ".join(again.output.split())
    assert len(otel_rows(study)) == len(rows)
