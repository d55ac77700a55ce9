"""OTLP export requests built with the ``opentelemetry-proto`` classes, shaped like the
agents' own records (names and attributes as their sources emit them)."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def any_value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def log(name: str, time_ns: int, attrs: dict[str, Any], body: str | None = None,
        event_name_attr: str | None = None) -> LogRecord:
    """A log record; ``event.name`` = ``event_name_attr`` (default: ``name``)."""
    rec = LogRecord(time_unix_nano=time_ns, observed_time_unix_nano=time_ns,
                    attributes=kvs({"event.name": event_name_attr or name, **attrs}),
                    trace_id=os.urandom(16), span_id=os.urandom(8))
    if body is not None:
        rec.body.CopyFrom(AnyValue(string_value=body))
    return rec


def logs_request(records: list[LogRecord], service: str = "agent") -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend(kvs({"service.name": service}))
    sl = rl.scope_logs.add()
    sl.scope.name = service
    sl.log_records.extend(records)
    return req


def span_request(name: str, start_ns: int, end_ns: int, attrs: dict[str, Any],
                 service: str = "claude-code") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kvs({"service.name": service}))
    ss = rs.scope_spans.add()
    ss.spans.append(Span(name=name, trace_id=os.urandom(16), span_id=os.urandom(8),
                         start_time_unix_nano=start_ns, end_time_unix_nano=end_ns,
                         attributes=kvs(attrs)))
    return req


def metric_request(name: str, time_ns: int, value: int) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    m = Metric(name=name, unit="1")
    m.sum.data_points.append(NumberDataPoint(time_unix_nano=time_ns, as_int=value,
                                             attributes=kvs({"type": "x"})))
    sm.metrics.append(m)
    return req


def claude_log(event: str, time_ns: int, attrs: dict[str, Any]) -> LogRecord:
    """Claude Code's shape: ``event.name`` without the prefix, the body with it."""
    return log(event, time_ns, {"session.id": "s-1", **attrs}, body=f"claude_code.{event}",
               event_name_attr=event)


def gemini_log(event: str, time_ns: int, attrs: dict[str, Any]) -> LogRecord:
    return log(f"gemini_cli.{event}", time_ns, {"session.id": "g-1", **attrs})
