"""The OTLP/gRPC receiver (``proxy.otlp_grpc_port``): the agents' gRPC exporters, the
default of several of them, into the same ``events`` as the HTTP receiver.

Its server runs in its own threads (grpcio's thread pool), never on the proxy's event loop,
whose token path only relays and shapes. Keys as over HTTP, in the gRPC metadata
(``authorization: Bearer …``: a participant key, or the team token of an observe study);
errors are gRPC status codes (UNAUTHENTICATED, INVALID_ARGUMENT, UNAVAILABLE). Needs the
``[telemetry]`` extra and ``grpcio``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from flowtrial.study.config import StudyConfig
from flowtrial.study.participants import participant_by_key
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database, WriteBatch, utcnow, write_rows

from ..proxy.auth import key_from_headers
from .ingest import prepare_rows
from .otlp import Signal, records
from .team import partial_success, refresh_turns, team_auth, team_rows

__all__ = ["serve_otlp_grpc"]


class _Export:
    """One signal's ``Export``: authenticate, map, write (synchronously, in a pool thread)."""

    def __init__(self, database: Database, config: StudyConfig, signal: Signal,
                 response: Callable[[], Any]) -> None:
        self.database, self.signal, self.response = database, signal, response
        self.full = config.capture.content == "full"
        self.observe = config.study.design == "observe"

    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any:
        meta = {k.lower(): v for k, v in context.invocation_metadata()
                if isinstance(v, str)}
        key = key_from_headers(meta)
        participant = participant_by_key(self.database, key) if key else None
        team = team_auth(self.database, meta) if participant is None and self.observe else None
        if participant is None and team is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown flowtrial key: "
                          "set the OTLP headers to authorization=Bearer ft_…")
        recs = records(self.signal, request)
        dropped = 0
        if team is not None:
            rows, dropped = team_rows(self.database, team, recs, self.full, time.time_ns(),
                                      utcnow())
        else:
            assert participant is not None  # noqa: S101 - abort() above raised otherwise
            rows = prepare_rows(self.database, participant.id, recs, self.full,
                                time.time_ns(), utcnow())
        if rows:
            try:
                write_rows(self.database, [WriteBatch(Event, rows, ignore_conflicts=True)])
            except Exception as exc:  # noqa: BLE001 - the exporter retries; nothing claimed
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              f"the records could not be written ({type(exc).__name__}): retry")
            if team is not None:
                refresh_turns(self.database, rows)
        return partial_success(self.response(), self.signal, dropped)


def serve_otlp_grpc(database: Database, config: StudyConfig, host: str, port: int,
                    workers: int = 4) -> tuple[grpc.Server, int]:
    """Start the receiver on ``host:port`` (0 picks a free port); returns (server, port).
    Stop it with ``server.stop(grace)``."""
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
                         options=[("grpc.max_receive_message_length",
                                   config.proxy.max_body_bytes)])

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        Export = _Export(database, config, "logs", logs_service_pb2.ExportLogsServiceResponse)

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        Export = _Export(database, config, "traces",
                         trace_service_pb2.ExportTraceServiceResponse)

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        Export = _Export(database, config, "metrics",
                         metrics_service_pb2.ExportMetricsServiceResponse)

    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound
