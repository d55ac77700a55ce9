"""The proxy's front door: limits every connection meets before the app sees a request.

uvicorn's httptools protocol, with (settings in ``[proxy]``, docs/operators/limits.md):

- **header bytes** (``max_header_bytes``): the request line and headers are collected here
  until their blank line and handed to httptools in one piece, so the parser sees each header
  once (httptools builds a header value that arrives in many reads by repeated
  concatenation: quadratic in its size). More than the limit without the blank line is
  answered **431** at once, without parsing any of it.
- **time to receive the headers** (``header_timeout_s``, from the connection or from the end
  of the previous answer's request) and **the body** (``body_timeout_s``, from the end of the
  headers): past either, **408** and the connection closes. A silent connection or a
  slowloris holds a slot at most this long.
- **idle keep-alive** (``idle_timeout_s``): uvicorn's keep-alive timeout.
- **open connections** (``max_connections``, HTTP and WebSocket): a new connection beyond it is
  answered **503** and closed; refusals are logged (at most one line per 10 s) and counted.
  Connections already answered and lingering (below) give way first: the oldest is closed
  and the new one admitted (:class:`Lingering`), so a flood the other limits answered
  cannot fill the door for the second its rejections linger.
- **connections that have not sent a whole request head yet** (``max_preauth_connections`` in
  total, ``max_preauth_per_client`` per client address, both summed over ``--workers``):
  beyond either, the *oldest* such connection (in the worker that sees the excess) is
  answered **408** and closed (:class:`PreauthRegistry`), so a flood of
  half-open or keyless connections ages itself out instead of keeping others from
  connecting (a new client sends its head within milliseconds).

Rejections end with a lingering close (the answer, then EOF; what the client still sends is
read and dropped for up to ``LINGER_S``) so the client reads the status instead of a reset.
Counters are on :class:`FrontDoorStats` (the health endpoint's ``front_door``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from flowtrial.study.config import ProxySection

from . import shared_counts
from .protocols import shape_for
from .protocols.base import openai_error
from .shared_counts import Table

__all__ = ["FrontDoorStats", "GuardedHttpProtocol", "Limits", "Lingering", "PreauthRegistry",
           "guarded_protocol"]

log = logging.getLogger("flowtrial.proxy")

#: After a rejection: how long to read and drop what the client still sends before closing.
LINGER_S = 1.0
#: ... and at most this much of it.
LINGER_BYTES = 1 << 20
#: A connection refused at the door (over max_connections) is closed right after its 503: it
#: has usually sent nothing yet, and its socket is one of the file descriptors the limit
#: protects (out of them, libuv accepts and drops new connections without a word).
REFUSED_LINGER_S = 0.0
#: A WebSocket message this much over max_body_bytes closes the socket (1009); below it the
#: proxy answers the protocol's own 413 error and keeps the socket.
WS_FRAME_SLACK = 64 * 1024
#: File descriptors kept for the database, upstream connections' pool overhead and logs.
FD_RESERVE = 64
_LOG_EVERY_S = 10.0
_HEAD_ENDS = (b"\n\r\n", b"\n\n")  # a blank line (CRLF or bare LF, as llhttp accepts)


@dataclass(frozen=True)
class Limits:
    """The front door's limits (from ``[proxy]``)."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    max_preauth: int = 256
    max_preauth_per_client: int = 64

    @classmethod
    def from_config(cls, proxy: ProxySection) -> Limits:
        return cls(proxy.max_header_bytes, proxy.header_timeout_s, proxy.body_timeout_s,
                   proxy.idle_timeout_s, usable_connections(proxy.max_connections),
                   proxy.max_preauth_connections, proxy.max_preauth_per_client)


def usable_connections(wanted: int) -> int:
    """``wanted``, or fewer if the process may not open that many files: each proxied stream
    holds two (the client's and the upstream's). Raises the soft limit to the hard one first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    usable = max(1, (soft - FD_RESERVE) // 2)
    log.warning("proxy.max_connections = %d needs %d open files but the limit is %d "
                "(ulimit -n): at most %d connections", wanted, need, soft, usable)
    return usable


@dataclass
class FrontDoorStats:
    """What the front door refused (for the health endpoint)."""

    headers_too_large: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    connections_refused: int = 0
    preauth_evicted: int = 0
    malformed: int = 0
    max_connections: int = 0
    _last_log: float = field(default=0.0, repr=False)
    _unlogged: int = field(default=0, repr=False)

    def snapshot(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def refused(self, client: Any, open_now: int) -> None:
        """Count a refused connection; log it, at most one line per 10 s."""
        self.connections_refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            log.warning("%d open connections (proxy.max_connections = %d): refused %d new "
                        "one(s) with 503, the latest from %s", open_now, self.max_connections,
                        self._unlogged, client)
            self._last_log, self._unlogged = now, 0


class PreauthRegistry:
    """Connections that have not yet sent a whole request head, oldest first, in total and
    per client address; :meth:`add` returns the ones to evict (this worker's oldest beyond a
    cap). The counts are summed over ``--workers`` (:mod:`.shared_counts` ``preauth``), so a
    flood spread over the workers meets one cap, not one per worker."""

    _ALL = "\x00all"  # the total's key (no address contains a NUL)

    def __init__(self, total: int, per_client: int, shared: Table | None = None) -> None:
        self.total, self.per_client = total, per_client
        self.shared = shared if shared is not None else shared_counts.counts("preauth")
        self._all: OrderedDict[int, GuardedHttpProtocol] = OrderedDict()
        self._by_client: dict[str, OrderedDict[int, GuardedHttpProtocol]] = {}

    def add(self, conn: GuardedHttpProtocol, client: str) -> list[GuardedHttpProtocol]:
        self._all[id(conn)] = conn
        mine = self._by_client.setdefault(client, OrderedDict())
        mine[id(conn)] = conn
        self.shared.add(client, 1)
        self.shared.add(self._ALL, 1)
        out: list[GuardedHttpProtocol] = []
        if self.shared.total(client) > self.per_client:
            out.append(next(iter(mine.values())))
        if self.shared.total(self._ALL) > self.total:
            oldest = next(iter(self._all.values()))
            if oldest not in out:
                out.append(oldest)
        return out

    def remove(self, conn: GuardedHttpProtocol, client: str) -> None:
        if self._all.pop(id(conn), None) is None:
            return
        self.shared.add(client, -1)
        self.shared.add(self._ALL, -1)
        mine = self._by_client.get(client)
        if mine is not None:
            mine.pop(id(conn), None)
            if not mine:
                del self._by_client[client]

    def __len__(self) -> int:
        return len(self._all)


class Lingering:
    """Rejected connections still reading what their client sends (``LINGER_S``), oldest
    first. They have had their answer, so a new connection over ``max_connections`` takes the
    place of the oldest: :meth:`make_room` aborts it, and it stops counting at once (its
    ``connection_lost`` comes on a later loop turn)."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[int, GuardedHttpProtocol] = OrderedDict()
        self._released: set[int] = set()  # aborted, connection_lost not yet seen

    def add(self, conn: GuardedHttpProtocol) -> None:
        self._waiting[id(conn)] = conn

    def forget(self, conn: GuardedHttpProtocol) -> None:
        self._waiting.pop(id(conn), None)
        self._released.discard(id(conn))

    @property
    def released(self) -> int:
        """Connections still in uvicorn's set that no longer hold a place."""
        return len(self._released)

    def make_room(self, wanted: int) -> int:
        """Abort up to ``wanted`` of the oldest; how many were aborted."""
        done = 0
        while done < wanted and self._waiting:
            key, conn = self._waiting.popitem(last=False)
            self._released.add(key)
            conn.transport.abort()
            done += 1
        return done


def _request_path(head: bytes) -> str:
    """The path of a request line (without query or ``/p/<key>``), for the error's shape."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    path = parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) > 1 else "/"
    if path.startswith("/p/"):
        path = "/" + path[3:].partition("/")[2]
    return path


def _error_response(status: int, message: str, code: str, path: str) -> bytes:
    """A whole HTTP/1.1 answer in the shape of the protocol served on ``path``."""
    adapter = shape_for(path)
    body = (adapter.error_body(message, "invalid_request_error", code) if adapter
            else openai_error(message, "invalid_request_error", code))
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: ", str(len(body)).encode(), b"\r\n",
                     b"connection: close\r\n\r\n", body])


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol behind the front door's limits (module docstring)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: Limits,
                 stats: FrontDoorStats, preauth: PreauthRegistry | None = None,
                 lingering: Lingering | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._stats = stats
        self._preauth = preauth
        self._lingering = lingering if lingering is not None else Lingering()
        self._address = ""
        self._head = bytearray()  # request line + headers, held until their blank line
        self._line = b""  # the start of the last head given to the parser (the error's path)
        self._scanned = 0  # how much of _head has been searched for the blank line
        self._fed_tail = b""  # the last bytes handed to the parser (a blank line may straddle)
        self._in_head = True
        self._timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._dropped = 0

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        over = len(self.connections) - self._lingering.released - self._limits.max_connections
        if over > 0:
            over -= self._lingering.make_room(over)
        if over > 0:
            self._stats.refused(self.client, len(self.connections))
            self._reject(503, "the proxy has as many open connections as it allows "
                              "(proxy.max_connections): retry shortly", "too_many_connections",
                         linger_s=REFUSED_LINGER_S)
            return
        self._arm(self._limits.header_timeout_s, self._head_timeout)
        if self._preauth is not None:
            self._address = str(self.client[0]) if self.client else ""
            for old in self._preauth.add(self, self._address):
                old._evict()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lingering.forget(self)
        if self._preauth is not None:
            self._preauth.remove(self, self._address)
        super().connection_lost(exc)

    def _evict(self) -> None:
        """Too many connections without a whole request head: this one is the oldest."""
        if self._preauth is not None:
            self._preauth.remove(self, self._address)
        self._stats.preauth_evicted += 1
        self._reject(408, "the request headers did not arrive before newer connections "
                          "needed the slot (proxy.max_preauth_connections, "
                          "proxy.max_preauth_per_client)", "request_timeout")

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        if not self._in_head:
            self._fed_tail = data[-3:]
            super().data_received(data)
            return
        self._unset_keepalive_if_required()
        if self._timer is None:  # the first byte of a request on a kept-alive connection
            self._arm(self._limits.header_timeout_s, self._head_timeout)
        self._head += data
        end = self._head_end()
        limit = self._limits.max_header_bytes
        if end is None:
            if len(self._head) > limit:
                self._too_large()
            return
        if end > limit:
            self._too_large()
            return
        whole = bytes(self._head)
        self._line = whole[:256]
        self._head.clear()
        self._scanned = 0
        self._fed_tail = whole[-3:]
        super().data_received(whole)

    def _head_end(self) -> int | None:
        """Offset in _head just past the blank line that ends the headers, once it is in.

        Searches only what arrived since the last call (plus 3 bytes of overlap), so a head
        trickled in many reads costs linear time."""
        start = max(0, self._scanned - 3)
        self._scanned = len(self._head)
        window: bytes | bytearray = self._head
        offset = 0
        if start == 0 and self._fed_tail:  # a blank line may begin in bytes already parsed
            window, offset = self._fed_tail + self._head, len(self._fed_tail)
        hits = [(i, len(e)) for e in _HEAD_ENDS if (i := window.find(e, start)) >= 0]
        if not hits:
            return None
        i, n = min(hits)
        return max(0, i + n - offset)

    # -- parser callbacks -----------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        if self._preauth is not None:  # a whole head: the app authenticates it now
            self._preauth.remove(self, self._address)
        super().on_headers_complete()
        if self._expects_body():
            self._arm(self._limits.body_timeout_s, self._body_timeout)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._fed_tail = b""
        super().on_message_complete()

    def _expects_body(self) -> bool:
        if self.parser.should_upgrade():
            return False
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length"
                                                and value.strip() not in (b"0", b"")):
                return True
        return False

    # -- limits -----------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_large(self) -> None:
        self._stats.headers_too_large += 1
        self._reject(431, f"request headers larger than the proxy's limit of "
                          f"{self._limits.max_header_bytes} bytes (proxy.max_header_bytes)",
                     "request_header_fields_too_large")

    def _head_timeout(self) -> None:
        self._stats.header_timeouts += 1
        self._timed_out("headers", "header_timeout_s", self._limits.header_timeout_s)

    def _body_timeout(self) -> None:
        self._stats.body_timeouts += 1
        self._timed_out("body", "body_timeout_s", self._limits.body_timeout_s)

    def _path(self) -> str:
        """The path of the request being received (what has arrived of its head)."""
        if self._in_head:
            return _request_path(bytes(self._head[:256]) or self._line)
        return str(self.scope.get("path", ""))

    def send_400_response(self, msg: str) -> None:
        """Malformed framing (request line, headers, chunk sizes): uvicorn's plain-text 400
        replaced by the protocol's error shape, counted for the health endpoint."""
        self._stats.malformed += 1
        self._unset_keepalive_if_required()
        self.transport.write(_error_response(
            400, "the request is not valid HTTP/1.1 (its request line, headers or chunked "
                 "framing could not be parsed): fix the client, or what sits between it and "
                 "the proxy", "invalid_http_request", self._path()))
        self.transport.close()

    def _timed_out(self, what: str, setting: str, seconds: float) -> None:
        self._timer = None
        self._reject(408, f"the request {what} did not arrive within {seconds:g} s "
                          f"(proxy.{setting})", "request_timeout")

    def _reject(self, status: int, message: str, code: str,
                linger_s: float = LINGER_S) -> None:
        """Answer ``status`` (unless an answer has begun), end the request, close lingering."""
        if self._rejected or self.transport.is_closing():
            return
        self._rejected = True
        self._disarm()
        self._unset_keepalive_if_required()
        cycle = None if self._in_head else self.cycle  # the request being received, if any
        if cycle is None or not cycle.response_started:  # else the app has begun its answer
            self.transport.write(_error_response(status, message, code, self._path()))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() now says http.disconnect
            cycle.message_event.set()
        self._head.clear()
        if linger_s > 0 and self.transport.can_write_eof():
            self.transport.write_eof()
            self._lingering.add(self)
            self.loop.call_later(linger_s, self.transport.close)
        else:
            self.transport.close()


def guarded_protocol(limits: Limits, stats: FrontDoorStats) -> Any:
    """The protocol factory to give uvicorn as ``http=``."""
    stats.max_connections = limits.max_connections
    preauth = PreauthRegistry(limits.max_preauth, limits.max_preauth_per_client)
    return functools.partial(GuardedHttpProtocol, limits=limits, stats=stats,
                             preauth=preauth, lingering=Lingering())
