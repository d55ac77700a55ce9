"""Gemini CLI's ``telemetry.outfile``: the OpenTelemetry JS SDK's own records, not OTLP.

With ``outfile`` set, Gemini CLI swaps its OTLP exporters for ``FileLogExporter``,
``FileSpanExporter`` and ``FileMetricExporter`` (google-gemini/gemini-cli,
``packages/core/src/telemetry/file-exporters.ts``; chosen in ``…/telemetry/sdk.ts``). They
append each record to the one file as ``safeJsonStringify(record, 2) + "\\n"``
(``packages/core/src/utils/safeJsonStringify.ts``: ``JSON.stringify`` with 2-space indent, a
repeated object written as ``"[Circular]"``): pretty-printed JSON objects one after another.
What is written is the SDK object's own fields:

- a log record (``LogRecordImpl``, ``experimental/packages/sdk-logs/src/LogRecordImpl.ts`` of
  opentelemetry-js 0.218, the version Gemini CLI locks): ``hrTime`` / ``hrTimeObserved``
  (``[seconds, nanoseconds]``), ``spanContext``, ``attributes`` (``event.name`` =
  ``gemini_cli.<event>``), ``_body``, ``_eventName``, ``_severityNumber``, ``resource``,
  ``instrumentationScope``; later SDKs write ``_hrTime`` / ``_hrTimeObserved`` /
  ``_spanContext`` instead (0.221), read too;
- a span (``SpanImpl``, sdk-trace-base 2.7): ``name``, ``startTime``, ``endTime``,
  ``attributes``, ``_spanContext``, ``resource``, ``instrumentationScope``;
- a metrics export (``ResourceMetrics``): ``resource`` and ``scopeMetrics`` → ``metrics``
  → ``descriptor`` and ``dataPoints`` (``attributes``, ``endTime``, ``value``);
- the resource (``ResourceImpl``, resources 2.7): ``_rawAttributes`` as ``[key, value]``
  pairs (the first non-null value of a key wins, as the SDK's ``attributes`` getter does),
  ``_memoizedAttributes`` once read.

Each becomes the :class:`OtelRecord` an OTLP body with the same content would give, so the
agents' mappings apply unchanged. A record's digest is that of its JSON text (sorted keys):
importing the file again adds nothing. (Gemini CLI does not export over OTLP while
``outfile`` is set, so the same record cannot also have arrived live.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from .otlp import OtelRecord

__all__ = ["is_sdk_record", "sdk_records"]


def _ns(hr: Any) -> int:
    """An SDK ``HrTime`` (``[seconds, nanoseconds]``) in epoch ns (0 if it is not one)."""
    if (isinstance(hr, list) and len(hr) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in hr)):
        return int(hr[0]) * 1_000_000_000 + int(hr[1])
    return 0


def _first(doc: dict[str, Any], *keys: str) -> Any:
    return next((doc[k] for k in keys if doc.get(k) is not None), None)


def _resource(res: Any) -> dict[str, Any]:
    if not isinstance(res, dict):
        return {}
    memo = res.get("_memoizedAttributes")
    if isinstance(memo, dict):
        return dict(memo)
    out: dict[str, Any] = {}
    for pair in res.get("_rawAttributes") or []:
        # an unsettled async attribute (a Promise) is written as {}: the SDK skips it too
        if (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                and pair[1] is not None and not isinstance(pair[1], dict)):
            out.setdefault(pair[0], pair[1])
    return out


def _scope(doc: dict[str, Any], key: str = "instrumentationScope") -> str:
    scope = doc.get(key)
    return str(scope.get("name") or "") if isinstance(scope, dict) else ""


def _attrs(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _digest(doc: Any, *extra: str) -> str:
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False,
                                  separators=(",", ":")).encode())
    for e in extra:
        h.update(b"\0" + e.encode())
    return h.hexdigest()[:32]


def _span_ids(doc: dict[str, Any]) -> tuple[str, str]:
    ctx = _first(doc, "spanContext", "_spanContext")
    if not isinstance(ctx, dict):
        return "", ""
    return str(ctx.get("traceId") or ""), str(ctx.get("spanId") or "")


def _log(doc: dict[str, Any]) -> OtelRecord:
    attrs = _attrs(doc.get("attributes"))
    body = _first(doc, "_body", "body")
    name = str(attrs.get("event.name") or _first(doc, "_eventName", "eventName") or "")
    if not name and isinstance(body, str) and " " not in body and len(body) < 200:
        name = body
    time_ns = (_ns(_first(doc, "hrTime", "_hrTime"))
               or _ns(_first(doc, "hrTimeObserved", "_hrTimeObserved")))
    trace, span = _span_ids(doc)
    return OtelRecord("logs", name, time_ns, attrs, _resource(doc.get("resource")),
                      _scope(doc), body=body, trace_id=trace, span_id=span,
                      digest=_digest(doc))


def _span(doc: dict[str, Any]) -> OtelRecord:
    trace, span = _span_ids(doc)
    end = _ns(_first(doc, "endTime", "_endTime"))
    return OtelRecord("traces", str(doc.get("name") or ""), _ns(doc.get("startTime")),
                      _attrs(doc.get("attributes")), _resource(doc.get("resource")),
                      _scope(doc), end_ns=end or None, trace_id=trace, span_id=span,
                      digest=_digest(doc))


def _metric_points(doc: dict[str, Any]) -> Iterator[OtelRecord]:
    resource = _resource(doc.get("resource"))
    for sm in doc.get("scopeMetrics") or []:
        if not isinstance(sm, dict):
            continue
        scope = _scope(sm, "scope")
        for metric in sm.get("metrics") or []:
            desc = metric.get("descriptor") if isinstance(metric, dict) else None
            if not isinstance(desc, dict):
                continue
            for n, point in enumerate(metric.get("dataPoints") or []):
                if not isinstance(point, dict):
                    continue
                value = point.get("value")
                attrs = _attrs(point.get("attributes"))
                if isinstance(value, dict):  # a histogram: count and sum
                    attrs |= {"metric.count": value.get("count"), "metric.sum": value.get("sum")}
                else:
                    attrs["metric.value"] = value
                if desc.get("unit"):
                    attrs["metric.unit"] = desc["unit"]
                yield OtelRecord("metrics", str(desc.get("name") or ""),
                                 _ns(point.get("endTime")), attrs, resource, scope,
                                 digest=_digest(point, str(desc.get("name")), scope, str(n)))


def _kind(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return None
    if "scopeMetrics" in doc and "resource" in doc:
        return "metrics"
    if "startTime" in doc and "name" in doc and ("_spanContext" in doc or "endTime" in doc):
        return "traces"
    if "attributes" in doc and any(k in doc for k in ("hrTime", "_hrTime")):
        return "logs"
    return None


def is_sdk_record(doc: Any) -> bool:
    """Whether ``doc`` is a record as Gemini CLI's file exporters write it."""
    return _kind(doc) is not None


def sdk_records(doc: Any) -> list[OtelRecord]:
    """The records of one file-exporter object (empty if it is not one)."""
    kind = _kind(doc)
    if kind == "logs":
        return [_log(doc)]
    if kind == "traces":
        return [_span(doc)]
    if kind == "metrics":
        return list(_metric_points(doc))
    return []
