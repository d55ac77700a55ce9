"""Model request bodies parsed off the token loop when they are large.

``json.loads`` and the protocol's reading of a request (:class:`~.protocols.RequestInfo`;
likewise a Responses WebSocket message, :mod:`.socket_messages`) hold the GIL, so a thread
would still stall the loop that releases other participants' tokens: measured on the 2-vCPU
machine, a chat body of many short messages costs about 8–25 ms per MB to parse plus 5–9 ms
per MB to read (340k messages, 20 MB: 0.5 s + 0.18 s). Below :data:`OFF_LOOP_BYTES` (256
KiB, about 2 ms of parsing at the densest shape) the loop parses at once; above it, one
worker process does, and returns only what the loop needs — the request's view and its input
key (a few objects), or why the body is refused; it runs at nice 10 like the ingest
processes, so the kernel favours the loop on a busy machine. A process's round trip costs
the loop a pickled view (microseconds) and the body's copy into a pipe (done by the pool's
feeder thread, which releases the GIL on write). An arm's model written into a large body
goes the same way. At most :data:`MAX_WAITING` large bodies wait; beyond that the client
gets the protocol's 503 with ``Retry-After`` (no one else waits).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any

from ..turns.followups import input_key
from .protocols import BY_NAME, CompletionsAdapter, RequestInfo, read_view
from .refusal import Refusal
from .socket_messages import SocketMessage, read_socket_message

__all__ = ["MAX_WAITING", "OFF_LOOP_BYTES", "BodyParser", "ParseBusy", "Parsed",
           "parse_request"]

log = logging.getLogger(__name__)

OFF_LOOP_BYTES = 256 * 1024  # benchmarks/bench_body_parsing.py: ≥ 2 ms of parsing above it
MAX_WAITING = 8  # large bodies in or waiting for the parse process, per proxy process
RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request body read: its view and input key, or why it is refused (``error``)."""

    view: RequestInfo | None
    input_key: str | None = None
    error: str | None = None  # completes "the request body …" (400 invalid_json)


def parse_request(protocol: str, url_params: dict[str, str] | None, body: bytes) -> Parsed:
    """Parse and read one model request body (on the loop, or in the parse process)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return Parsed(None, error=f"is not valid JSON: {exc}")
    except RecursionError:
        return Parsed(None, error="is JSON nested too deeply to read")
    if not isinstance(obj, dict):
        return Parsed(None, error="must be a JSON object")
    return Parsed(read_view(protocol, obj, url_params), input_key(protocol, obj))


def parse_away(protocol: str, url_params: dict[str, str] | None, body: bytes) -> Parsed:
    """:func:`parse_request` in the parse process: the view without the conversation's parts
    and tool definitions (the simulated model's; the proxy reads neither), so what comes back
    is a few objects, not one per message (unpickling those would hold the loop's GIL)."""
    parsed = parse_request(protocol, url_params, body)
    if parsed.view is None:
        return parsed
    return Parsed(replace(parsed.view, parts=(), tool_defs=None), parsed.input_key)


def with_model(protocol: str, url_params: dict[str, str] | None, path: str, body: bytes,
               model: str) -> tuple[str, bytes]:
    """The request asking for ``model`` (the protocol's own rewrite, in the parse process)."""
    adapter = BY_NAME.get(protocol, CompletionsAdapter)()
    if url_params:
        adapter.url_params = url_params
    return adapter.with_model(path, body, model)


class ParseBusy(Refusal):
    """Too many large bodies waiting to be parsed: 503 + Retry-After to that client."""

    type_ = "server_error"

    def __init__(self) -> None:
        super().__init__(503, f"the proxy is parsing {MAX_WAITING} large request bodies "
                              f"already: retry in {RETRY_AFTER_S} s", "parse_busy")

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(RETRY_AFTER_S)}


class BodyParser:
    """Parses small bodies on the loop and large ones in one process (module docstring)."""

    def __init__(self, off_loop_bytes: int = OFF_LOOP_BYTES,
                 max_waiting: int = MAX_WAITING) -> None:
        self.off_loop_bytes = off_loop_bytes
        self.max_waiting = max_waiting
        self.waiting = 0
        self.offloaded = 0
        self.refused = 0
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._starting: asyncio.Lock | None = None

    async def parse(self, protocol: str, url_params: dict[str, str] | None,
                    body: bytes) -> Parsed:
        """The body's view (raises :class:`ParseBusy` when too many large ones wait)."""
        if len(body) < self.off_loop_bytes:
            return parse_request(protocol, url_params, body)
        result: Parsed = await self._offload(parse_away, protocol, url_params, body)
        return result

    async def read_socket_message(self, raw: str, limit: int) -> SocketMessage:
        """A Responses WebSocket message read (:mod:`.socket_messages`), off the loop when it
        is large (raises :class:`ParseBusy` when too many large ones wait)."""
        if len(raw) < self.off_loop_bytes or len(raw) > limit:
            return read_socket_message(raw, limit)
        read: SocketMessage = await self._offload(read_socket_message, raw, limit, False)
        return read if read.error is not None else replace(read, text=raw)

    async def with_model(self, protocol: str, url_params: dict[str, str] | None, path: str,
                         body: bytes, model: str) -> tuple[str, bytes]:
        """:meth:`~.protocols.ProtocolAdapter.with_model`, off the loop for a large body."""
        if len(body) < self.off_loop_bytes:
            return with_model(protocol, url_params, path, body, model)
        result: tuple[str, bytes] = await self._offload(with_model, protocol, url_params,
                                                        path, body, model)
        return result

    async def _offload(self, fn: Any, *args: Any) -> Any:
        if self.waiting >= self.max_waiting:
            self.refused += 1
            raise ParseBusy
        self.waiting += 1
        try:
            pool = await self._started()
            self.offloaded += 1
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except BrokenProcessPool:  # the process died (killed): a new one for the next body
            log.warning("the body parser's process died: starting another")
            with self._lock:
                self._pool = None
            raise ParseBusy from None
        finally:
            self.waiting -= 1

    async def _started(self) -> ProcessPoolExecutor:
        """The pool, started in a thread the first time (a process start must not block)."""
        if self._pool is not None:
            return self._pool
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._pool is None:
                await asyncio.to_thread(self._start)
        assert self._pool is not None
        return self._pool

    def _start(self) -> None:
        from .ingest import _context  # the forkserver the ingest processes also come from
        from .ingest_jobs import worker_init  # nice 10, as ingest: the loop comes first

        pool = ProcessPoolExecutor(max_workers=1, mp_context=_context(),
                                   initializer=worker_init)
        pool.submit(int).result(timeout=120)  # up and importable before the first body
        with self._lock:
            self._pool = pool

    def close(self) -> None:
        """Stop the parse process (blocking: run it in a thread)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
