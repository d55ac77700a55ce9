"""The OTLP/gRPC receiver (``proxy.otlp_grpc_port``): the agents' gRPC exporters, the
default of several of them, into the same ``events`` as the HTTP receiver.

Its server runs in its own threads (grpcio's thread pool) and hands each request's bytes,
unparsed, to the same export as the HTTP receiver (:class:`~.receiver.OtlpReceiver`): the
database gate, keys in the gRPC metadata (``authorization: Bearer …``: a participant key, or
the team token of an observe study), consent, ingest's share, quota and caps (parsed in its
processes, never on the event loop that releases tokens), the writer's order and the
counters. Errors are the same ``google.rpc`` codes as gRPC status codes (UNAUTHENTICATED,
PERMISSION_DENIED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE). Needs the
``[telemetry]`` extra and ``grpcio``.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.rpc import code_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from flowtrial.study.config import StudyConfig
from flowtrial.study.storage import Database

from .otlp import Signal
from .receiver import OtlpReceiver, Outcome, answer_message

__all__ = ["serve_otlp_grpc"]


#: The three OTLP services and their one method, ``Export``.
_SERVICES: dict[Signal, str] = {
    "logs": logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name,
    "traces": trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name,
    "metrics": metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name,
}
#: How long a pool thread waits for its export before answering UNAVAILABLE.
EXPORT_TIMEOUT_S = 300.0
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _handler(receiver: OtlpReceiver, signal: Signal, state: Any,
             loop: asyncio.AbstractEventLoop | None) -> Any:
    """``Export`` for ``signal``: the request's bytes go, unparsed, to the same export as
    over HTTP (:class:`~.receiver.OtlpReceiver`), on the proxy's event loop when there is
    one (whose ingest parses them in its processes), else in this thread's own loop."""

    def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
        meta = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}

        async def read() -> bytes:
            return raw

        run = receiver.export(state, signal, meta, read, "application/x-protobuf", None)
        try:
            out = (asyncio.run_coroutine_threadsafe(run, loop).result(EXPORT_TIMEOUT_S)
                   if loop is not None else asyncio.run(run))
        except TimeoutError:
            out = Outcome(503, code_pb2.UNAVAILABLE, "the proxy is busy: retry")
        if out.result is None:
            context.abort(_CODES.get(out.code, grpc.StatusCode.UNKNOWN), out.message)
            raise RuntimeError("grpc's abort returned")  # it raises
        return answer_message(signal, out.result).SerializeToString()

    return grpc.unary_unary_rpc_method_handler(export)  # no (de)serializers: bytes in, out


def serve_otlp_grpc(database: Database, config: StudyConfig, host: str, port: int,
                    workers: int = 4, *, state: Any = None,
                    loop: asyncio.AbstractEventLoop | None = None) -> tuple[grpc.Server, int]:
    """Start the receiver on ``host:port`` (0 picks a free port); returns (server, port).
    Inside the proxy pass its ``state`` and event ``loop`` (its key cache, gate, counters,
    ingest processes, caps and writer). Stop it with ``server.stop(grace)``."""
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
                         options=[("grpc.max_receive_message_length",
                                   config.proxy.max_body_bytes)])
    receiver = OtlpReceiver(database, config)
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(name, {"Export": _handler(receiver, signal, state,
                                                                         loop)})
        for signal, name in _SERVICES.items()))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound
