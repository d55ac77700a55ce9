"""OTLP export requests (logs, traces, metrics) decoded with ``opentelemetry-proto`` and
flattened into :class:`OtelRecord` items: one per log record, span or metric data point.

Bodies come as protobuf (``application/x-protobuf``) or OTLP JSON (``application/json``),
possibly gzip-compressed. JSON is read by protobuf's own ``json_format`` after one OTLP
deviation from the proto3 JSON mapping is undone: trace and span ids are hex, not base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from ..upload_caps import InflateError, inflate

__all__ = [
    "REQUEST_TYPES",
    "OtelRecord",
    "OtlpDecodeError",
    "Signal",
    "decode_request",
    "parse_json_request",
    "records",
]

Signal = Literal["logs", "traces", "metrics"]
REQUEST_TYPES: dict[Signal, type[Message]] = {
    "logs": ExportLogsServiceRequest,
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id",
                          "parent_span_id"})
MAX_INFLATED_BYTES = 64 * 1024 * 1024  # a gzip bomb stops here (files; the proxy: its cap)


class OtlpDecodeError(ValueError):
    """A body that is not an OTLP export request of the expected signal; ``too_large``: one
    that inflates beyond the cap (413 rather than 400)."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large

    def __reduce__(self) -> Any:  # crosses the ingest process boundary
        return (OtlpDecodeError, (str(self), self.too_large))


@dataclass(frozen=True)
class OtelRecord:
    """One log record, span or metric data point, with its resource and scope."""

    signal: Signal
    name: str  # event name (``event.name``, the log's event_name or body), span or metric name
    time_ns: int  # UTC epoch ns: the log's time, the span's start, the data point's time
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    end_ns: int | None = None  # spans only
    body: Any = None
    trace_id: str = ""
    span_id: str = ""
    digest: str = ""  # identifies the record whatever its encoding (deduplication)


def _hex_ids_to_base64(value: Any) -> Any:
    """OTLP JSON writes trace/span ids as hex; proto3 JSON (json_format) wants base64."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if k in _HEX_ID_KEYS and isinstance(item, str) and item:
                    try:
                        v[k] = base64.b64encode(bytes.fromhex(item)).decode()
                    except ValueError:
                        pass  # not hex: leave it for json_format to judge
                elif isinstance(item, dict | list):
                    todo.append(item)
        elif isinstance(v, list):
            todo.extend(x for x in v if isinstance(x, dict | list))
    return value


def parse_json_request(signal: Signal, data: Any) -> Message:
    """An OTLP JSON request (already parsed by ``json``) as its protobuf message."""
    if not isinstance(data, dict):
        raise OtlpDecodeError("an OTLP JSON request must be a JSON object")
    message = REQUEST_TYPES[signal]()
    try:
        json_format.ParseDict(_hex_ids_to_base64(data), message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, OverflowError,
            RecursionError) as exc:
        raise OtlpDecodeError(f"not an OTLP/JSON {signal} request: {exc}") from None
    return message


def decode_request(signal: Signal, body: bytes, content_type: str | None,
                   content_encoding: str | None = None,
                   max_inflated: int = MAX_INFLATED_BYTES) -> tuple[Message, bool]:
    """The export request in ``body``; also whether it was JSON (the answer's encoding).
    A compressed body inflates to at most ``max_inflated`` bytes."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in ("application/x-protobuf", "application/protobuf", "application/json"):
        raise OtlpDecodeError(f"unsupported Content-Type {content_type!r}: send "
                              "application/x-protobuf or application/json (OTLP/HTTP)")
    try:
        raw = inflate(body, content_encoding, max_inflated)
    except InflateError as exc:
        raise OtlpDecodeError(str(exc), exc.too_large) from None
    if media == "application/json":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise OtlpDecodeError(f"the body is not valid JSON: {exc}") from None
        return parse_json_request(signal, data), True
    message = REQUEST_TYPES[signal]()
    try:
        message.ParseFromString(raw)
    except (DecodeError, RecursionError) as exc:
        raise OtlpDecodeError(f"not an OTLP/protobuf {signal} request: {exc}") from None
    return message, False


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    if kind == "bytes_value":
        return binascii.hexlify(v.bytes_value).decode()
    return getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _digest(*parts: Message) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = p.SerializeToString(deterministic=True)
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:32]


def _resource_key(resource: Message) -> KeyValue:
    # Only the resource's attributes identify the sender (dropped counts do not).
    kv = KeyValue(key="resource")
    for a in resource.attributes:
        kv.value.kvlist_value.values.append(a)
    return kv


def _log_name(attrs: dict[str, Any], record: Any, body: Any) -> str:
    name = str(attrs.get("event.name") or record.event_name or "")
    # Claude Code's event.name lacks its prefix; the body has it (`claude_code.<event>`).
    if isinstance(body, str) and " " not in body and len(body) < 200 and (
            not name or body.endswith("." + name)):
        name = body or name
    return name


def _log_records(req: ExportLogsServiceRequest) -> Iterator[OtelRecord]:
    for rl in req.resource_logs:
        resource = _attrs(rl.resource.attributes)
        rkey = _resource_key(rl.resource)
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                attrs = _attrs(lr.attributes)
                body = _value(lr.body)
                yield OtelRecord(
                    "logs", _log_name(attrs, lr, body),
                    lr.time_unix_nano or lr.observed_time_unix_nano, attrs, resource,
                    sl.scope.name, body=body, trace_id=lr.trace_id.hex(),
                    span_id=lr.span_id.hex(), digest=_digest(rkey, lr))


def _spans(req: ExportTraceServiceRequest) -> Iterator[OtelRecord]:
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        rkey = _resource_key(rs.resource)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                yield OtelRecord(
                    "traces", sp.name, sp.start_time_unix_nano, _attrs(sp.attributes),
                    resource, ss.scope.name, end_ns=sp.end_time_unix_nano or None,
                    trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    digest=_digest(rkey, sp))


def _points(metric: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
    kind = metric.WhichOneof("data")
    if kind in ("gauge", "sum"):
        for p in getattr(metric, kind).data_points:
            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
            yield p, {"value": value}
    elif kind in ("histogram", "exponential_histogram", "summary"):
        for p in getattr(metric, kind).data_points:
            yield p, {"count": p.count, "sum": p.sum}


def _metric_points(req: ExportMetricsServiceRequest) -> Iterator[OtelRecord]:
    for rm in req.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        rkey = _resource_key(rm.resource)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name_key = KeyValue(key=metric.name)
                for point, value in _points(metric):
                    attrs = {**_attrs(point.attributes), **{f"metric.{k}": v
                                                            for k, v in value.items()}}
                    if metric.unit:
                        attrs["metric.unit"] = metric.unit
                    yield OtelRecord("metrics", metric.name, point.time_unix_nano, attrs,
                                     resource, sm.scope.name,
                                     digest=_digest(rkey, name_key, point))


def records(signal: Signal, request: Message) -> list[OtelRecord]:
    """Every log record, span or metric data point of an export request."""
    if signal == "logs":
        return list(_log_records(request))
    if signal == "traces":
        return list(_spans(request))
    return list(_metric_points(request))
