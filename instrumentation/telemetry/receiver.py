"""The OTLP/HTTP receiver: agents' own telemetry (logs, traces, metrics) into ``events``.

``POST /flowtrial/otlp/v1/logs``, ``/v1/traces``, ``/v1/metrics`` — set
``OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:PORT/flowtrial/otlp`` (exporters append
``/v1/<signal>``), with the participant's own key in the OTLP headers
(``Authorization=Bearer ft_…``). Bodies: ``application/x-protobuf`` or ``application/json``,
gzip or not. Answers as OTLP asks: 200 with an empty ``Export…ServiceResponse``; errors as
a ``google.rpc.Status`` in the request's encoding (401 no key, 400 a body that is not an
OTLP request or carries a time outside 2000–2100 — nothing of it written, 413 too large or
inflating beyond ``proxy.max_inflated_bytes``, 429 the participant's share of ingest or daily
quota, 503 while ingest is saturated or rows cannot be written; 429/503 with
``Retry-After``). Records beyond ``proxy.max_records_per_post`` are not stored and are
reported through OTLP's ``partial_success``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.study.config import StudyConfig
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database, RecordWriter, WriteBatch

from ..proxy.auth import Authenticator
from ..proxy.hooks import count_error, count_request
from ..proxy.ingest import Ingest, IngestBusy, ingest_of
from ..proxy.ingest_jobs import OtlpResult, otlp_job
from ..request_body import BodyTooLarge, read_body
from .otlp import OtlpDecodeError, Signal
from .team import partial_success, refresh_turns, team_auth

__all__ = ["OTLP_PREFIX", "telemetry_routes"]

#: The upload share (and daily quota) a team study's batches count against.
TEAM_SHARE = "team"

OTLP_PREFIX = "/flowtrial/otlp"
_RESPONSES: dict[Signal, type[Message]] = {
    "logs": ExportLogsServiceResponse,
    "traces": ExportTraceServiceResponse,
    "metrics": ExportMetricsServiceResponse,
}
Authenticate = Callable[[Mapping[str, str]], Awaitable[Any]]


def _is_json(request: Request) -> bool:
    ctype = request.headers.get("content-type") or ""
    return ctype.split(";", 1)[0].strip().lower() == "application/json"


def _message(msg: Message, as_json: bool, status: int = 200,
             headers: dict[str, str] | None = None) -> Response:
    if as_json:
        return Response(json_format.MessageToJson(msg, indent=None), status, headers=headers,
                        media_type="application/json")
    return Response(msg.SerializeToString(), status, headers=headers,
                    media_type="application/x-protobuf")


def _status(http: int, code: int, message: str, as_json: bool,
            headers: dict[str, str] | None = None) -> Response:
    """OTLP's error body: a ``google.rpc.Status`` in the request's encoding."""
    return _message(status_pb2.Status(code=code, message=message), as_json, http, headers)


_REJECTED_FIELD: dict[Signal, str] = {"logs": "rejected_log_records",
                                      "traces": "rejected_spans",
                                      "metrics": "rejected_data_points"}


def _answer(signal: Signal, result: OtlpResult) -> Response:
    msg = _RESPONSES[signal]()
    if result.dropped:  # a team's records that named no one
        msg = partial_success(msg, signal, result.dropped)
    if result.rejected:  # OTLP's partial success: the exporter must not retry these
        ps = msg.partial_success
        setattr(ps, _REJECTED_FIELD[signal], result.rejected + result.dropped)
        ps.error_message = "; ".join(filter(None, [ps.error_message, result.message]))
    return _message(msg, result.as_json)


def telemetry_routes(database: Database, config: StudyConfig, *,
                     authenticate: Authenticate | None = None,
                     writer: RecordWriter | None = None) -> list[BaseRoute]:
    """The three OTLP/HTTP routes under :data:`OTLP_PREFIX`.

    Inside the proxy app they share its key cache, ingest processes, writer and database
    gate (``app.state.proxy``); on their own they check keys, parse in a thread and write
    here. Parsing runs off the event loop (:mod:`flowtrial.instrumentation.proxy.ingest`).
    """
    own = Authenticator(database)
    full = config.capture.content == "full"
    observe = config.study.design == "observe"
    limit = config.proxy.max_body_bytes
    standalone: list[Ingest] = []  # made on first use: listing the routes needs no database

    def own_ingest() -> Ingest:
        if not standalone:
            standalone.append(Ingest(database.url, writer, config.proxy, processes=False))
        return standalone[0]

    def proxy_state(request: Request) -> Any:
        return getattr(request.app.state, "proxy", None)

    def make(signal: Signal) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            st = proxy_state(request)
            as_json = _is_json(request)
            if st is not None:
                count_request(st)
                if not st.recorder.gate.ok:
                    count_error(st)
                    return _status(503, code_pb2.UNAVAILABLE, "the study database is "
                                   "unavailable: the exporter should retry", as_json,
                                   {"retry-after": "5"})
            auth = authenticate or (st.auth.authenticate if st is not None
                                    else own.authenticate)
            participant = await auth(request.headers)
            team = None
            if participant is None and observe:  # a team study: the team token, no keys
                team = await asyncio.to_thread(team_auth, database, request.headers)
            if participant is None and team is None:
                return _status(401, code_pb2.UNAUTHENTICATED,
                               "missing or unknown flowtrial participant key: set the OTLP "
                               "headers to Authorization=Bearer ft_… (your own key)", as_json)
            if (st is not None and participant is not None
                    and (standing := st.auth.refusal(participant.id)) is not None):
                return _status(403, code_pb2.PERMISSION_DENIED, standing.message, as_json)
            ingest = ingest_of(st) if st is not None and writer is None else own_ingest()
            # A team's batches share one upload share and quota (its people are split later).
            pid = participant.id if participant is not None else TEAM_SHARE
            try:
                body = await read_body(request, limit)
                result = await ingest.run(
                    pid, otlp_job, ingest.context, pid, signal, body,
                    request.headers.get("content-type"),
                    request.headers.get("content-encoding"), full, time.time_ns(), team)
                if result.rows:
                    await ingest.store(pid, WriteBatch(Event, result.rows,
                                                       ignore_conflicts=True), database)
                    if st is not None and participant is not None:
                        st.turns.note_events(pid, result.rows)  # the typing-speed rule yields
                    if team is not None:  # the people's turns, from the events just written
                        await asyncio.to_thread(refresh_turns, database, result.rows)
            except BodyTooLarge:
                return _status(413, code_pb2.RESOURCE_EXHAUSTED, f"request body larger than "
                               f"the proxy's limit of {limit} bytes (proxy.max_body_bytes)",
                               as_json)
            except OtlpDecodeError as exc:
                if st is not None:
                    count_error(st)
                if exc.too_large:
                    return _status(413, code_pb2.RESOURCE_EXHAUSTED, str(exc), as_json)
                return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
            except IngestBusy as exc:
                code = code_pb2.RESOURCE_EXHAUSTED if exc.status == 429 else code_pb2.UNAVAILABLE
                return _status(exc.status, code, exc.message, as_json, exc.headers())
            except Exception as exc:  # noqa: BLE001 - the exporter retries; nothing claimed
                return _status(503, code_pb2.UNAVAILABLE, "the records could not be "
                               f"written ({type(exc).__name__}): retry", as_json,
                               {"retry-after": "5"})
            return _answer(signal, result)

        endpoint.__name__ = f"otlp_{signal}"
        return endpoint

    return [Route(f"{OTLP_PREFIX}/v1/{signal}", make(signal), methods=["POST"])
            for signal in ("logs", "traces", "metrics")]
