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
from dataclasses import dataclass
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

__all__ = ["OTLP_PREFIX", "OtlpReceiver", "Outcome", "answer_message", "telemetry_routes"]

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


def answer_message(signal: Signal, result: OtlpResult) -> Message:
    """The ``Export…ServiceResponse`` for an accepted post (partial success, if any)."""
    msg = _RESPONSES[signal]()
    if result.dropped:  # a team's records that named no one
        msg = partial_success(msg, signal, result.dropped)
    if result.rejected:  # OTLP's partial success: the exporter must not retry these
        ps = msg.partial_success
        setattr(ps, _REJECTED_FIELD[signal], result.rejected + result.dropped)
        ps.error_message = "; ".join(filter(None, [ps.error_message, result.message]))
    return msg


@dataclass
class Outcome:
    """What one export came to, for either transport: ``result`` when accepted, else an
    HTTP status, a ``google.rpc`` code (gRPC's status codes are the same numbers) and a
    message."""

    status: int
    code: int = code_pb2.OK
    message: str = ""
    headers: dict[str, str] | None = None
    result: OtlpResult | None = None


class OtlpReceiver:
    """One export, whichever transport brought it (HTTP here, gRPC in
    :mod:`.grpc_receiver`): the database gate, the key (or a team's token), consent, the
    body under ``proxy.max_body_bytes``, ingest (off the event loop, its share, quota and
    caps), storing, and counting every answer (:func:`~..proxy.hooks.count_error`).

    Inside the proxy app (``st`` given) it shares the proxy's key cache, ingest processes,
    writer and gate; on its own it checks keys, parses in a thread and writes here."""

    def __init__(self, database: Database, config: StudyConfig, *,
                 authenticate: Authenticate | None = None,
                 writer: RecordWriter | None = None) -> None:
        self.database, self.writer, self.authenticate = database, writer, authenticate
        self.own = Authenticator(database)
        self.full = config.capture.content == "full"
        self.observe = config.study.design == "observe"
        self.limit = config.proxy.max_body_bytes
        self.settings = config.proxy
        self._standalone: Ingest | None = None  # made on first use

    def _ingest(self, st: Any) -> Ingest:
        if st is not None and self.writer is None:
            return ingest_of(st)
        if self._standalone is None:
            self._standalone = Ingest(self.database.url, self.writer, self.settings,
                                      processes=False)
        return self._standalone

    async def export(self, st: Any, signal: Signal, headers: Mapping[str, str],
                     read: Callable[[], Awaitable[bytes]], content_type: str | None,
                     content_encoding: str | None) -> Outcome:
        """Count the request, run it, count a refusal."""
        if st is not None:
            count_request(st)
        out = await self._export(st, signal, headers, read, content_type, content_encoding)
        if st is not None and out.status >= 400:
            count_error(st)
        return out

    async def _export(self, st: Any, signal: Signal, headers: Mapping[str, str],
                      read: Callable[[], Awaitable[bytes]], content_type: str | None,
                      content_encoding: str | None) -> Outcome:
        if st is not None and not st.recorder.gate.ok:
            return Outcome(503, code_pb2.UNAVAILABLE, "the study database is unavailable: "
                           "the exporter should retry", {"retry-after": "5"})
        auth = self.authenticate or (st.auth.authenticate if st is not None
                                     else self.own.authenticate)
        participant = await auth(headers)
        team = None
        if participant is None and self.observe:  # a team study: the team token, no keys
            team = await asyncio.to_thread(team_auth, self.database, headers)
        if participant is None and team is None:
            return Outcome(401, code_pb2.UNAUTHENTICATED, "missing or unknown flowtrial "
                           "participant key: set the OTLP headers to Authorization=Bearer "
                           "ft_… (your own key)")
        if (st is not None and participant is not None
                and (standing := st.auth.refusal(participant.id)) is not None):
            return Outcome(403, code_pb2.PERMISSION_DENIED, standing.message)
        ingest = self._ingest(st)
        # A team's batches share one upload share and quota (its people are split later).
        pid = participant.id if participant is not None else TEAM_SHARE
        try:
            body = await read()
            result = await ingest.run(pid, otlp_job, ingest.context, pid, signal, body,
                                      content_type, content_encoding, self.full,
                                      time.time_ns(), team)
            if result.rows:
                await ingest.store(pid, WriteBatch(Event, result.rows, ignore_conflicts=True),
                                   self.database)
                if st is not None and participant is not None:
                    st.turns.note_events(pid, result.rows)  # the typing-speed rule yields
                if team is not None:  # the people's turns, from the events just written
                    await asyncio.to_thread(refresh_turns, self.database, result.rows)
        except BodyTooLarge:
            return Outcome(413, code_pb2.RESOURCE_EXHAUSTED, "request body larger than the "
                           f"proxy's limit of {self.limit} bytes (proxy.max_body_bytes)")
        except OtlpDecodeError as exc:
            return Outcome(413 if exc.too_large else 400, code_pb2.RESOURCE_EXHAUSTED
                           if exc.too_large else code_pb2.INVALID_ARGUMENT, str(exc))
        except IngestBusy as exc:
            return Outcome(exc.status, code_pb2.RESOURCE_EXHAUSTED if exc.status == 429
                           else code_pb2.UNAVAILABLE, exc.message, exc.headers())
        except Exception as exc:  # noqa: BLE001 - the exporter retries; nothing claimed
            return Outcome(503, code_pb2.UNAVAILABLE, "the records could not be written "
                           f"({type(exc).__name__}): retry", {"retry-after": "5"})
        return Outcome(200, result=result)


def telemetry_routes(database: Database, config: StudyConfig, *,
                     authenticate: Authenticate | None = None,
                     writer: RecordWriter | None = None) -> list[BaseRoute]:
    """The three OTLP/HTTP routes under :data:`OTLP_PREFIX` (:class:`OtlpReceiver`)."""
    receiver = OtlpReceiver(database, config, authenticate=authenticate, writer=writer)
    limit = config.proxy.max_body_bytes

    def make(signal: Signal) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            as_json = _is_json(request)
            out = await receiver.export(
                getattr(request.app.state, "proxy", None), signal, request.headers,
                lambda: read_body(request, limit), request.headers.get("content-type"),
                request.headers.get("content-encoding"))
            if out.result is None:
                return _status(out.status, out.code, out.message, as_json, out.headers)
            return _message(answer_message(signal, out.result), out.result.as_json)

        endpoint.__name__ = f"otlp_{signal}"
        endpoint.otlp = receiver  # type: ignore[attr-defined]  # its checks (tests, docs)
        return endpoint

    return [Route(f"{OTLP_PREFIX}/v1/{signal}", make(signal), methods=["POST"])
            for signal in ("logs", "traces", "metrics")]
