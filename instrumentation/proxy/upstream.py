"""Where requests go: the in-process simulated model, or a real API over HTTP.

:class:`MockUpstream` calls :class:`~flowtrial.instrumentation.mock_model.MockModel` directly (no
HTTP, no sockets) when ``upstream.kind = "mock"``. :class:`HttpUpstream` streams from a real base
URL with httpx; its API key is read from the environment variable *named* in the study at
each request — it is never stored, logged, recorded or echoed: an error reply (4xx/5xx) that
quotes it gets it redacted here already, so even the answers relayed outside a cycle
(``/v1/models``, ``count_tokens``) cannot pass it on. Connection failures become
:class:`UpstreamError` 502, timeouts 504.

How a request is addressed is its protocol's :class:`~.protocols.base.Family` (nothing here
branches on a family): whether the base URL carries the version (OpenAI's
``https://api.openai.com/v1``: the proxy path's ``/v1`` is dropped; Anthropic's and Google's
have none), the header the key goes in (``Authorization: Bearer``, ``x-api-key``,
``x-goog-api-key``) and default headers (``anthropic-version`` =
:data:`ANTHROPIC_VERSION` when the client sent none); the client's ``anthropic-beta`` and
SDK headers pass through. With ``credentials = "participant"`` no study key is sent: the
relay passes the participant's own credential on (:mod:`.auth`).

The Responses WebSocket mode: :meth:`Upstream.open_socket` gives an :class:`UpstreamSocket`
per client connection — for the mock, :meth:`MockModel.respond_ws` in-process; for a real
OpenAI endpoint, a ``websockets`` client connection to ``wss://…/v1/responses`` (opened on
the first turn, reopened if the upstream closed it between turns).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from flowtrial.study.errors import FlowtrialError

from .http1 import HeaderInjectionError, LeanTransport, request_head
from .protocols import CREDENTIAL_HEADERS, FAMILIES
from .protocols.base import OPENAI, Family
from .protocols.messages import ANTHROPIC_VERSION
from .releases import give_way
from .scrub import Scrubber

__all__ = [
    "ANTHROPIC_VERSION",
    "CYCLE_HEADER",
    "HttpUpstream",
    "MockUpstream",
    "Upstream",
    "UpstreamError",
    "UpstreamReply",
    "UpstreamSocket",
    "forwardable_request_headers",
    "forwardable_response_headers",
]

CYCLE_HEADER = "x-flowtrial-cycle-id"
_TERMINAL_WS = {"response.completed", "response.incomplete", "response.failed", "error"}
_TERMINAL_MARKS = tuple(f'"{t}"'.encode() for t in _TERMINAL_WS)

# Hop-by-hop and length/encoding headers are the proxy's own business on each leg.
_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "content-length", "host",
}
# ``expect``: the proxy has the whole body before it calls the upstream, so a client's
# ``100-continue`` has been answered already (RFC 9110 §10.1.1) and is not passed on.
_REQUEST_DROP = _HOP | set(CREDENTIAL_HEADERS) | {"accept-encoding", "cookie", "expect"}
_RESPONSE_DROP = _HOP | {"content-encoding", "set-cookie", "date", "server", CYCLE_HEADER}


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer in time (502 / 504)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def code(self, otherwise: str = "upstream_unreachable") -> str:
        """The error code the client is given: one mapping for every way in."""
        return {501: "no_upstream", 504: "upstream_timeout"}.get(self.status, otherwise)


class UpstreamConfigError(FlowtrialError):
    """The study's upstream cannot be used (e.g. its key variable is not set)."""


async def _noop() -> None:
    return None


@dataclass
class UpstreamReply:
    """Status, headers and the body as an async iterator of byte chunks."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] = field(default=_noop)

    @property
    def content_type(self) -> str:
        for k, v in self.headers:
            if k.lower() == "content-type":
                return v
        return ""

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.lower().startswith("text/event-stream")


def forwardable_request_headers(headers: Mapping[str, str] | Any) -> dict[str, str]:
    """Client headers worth passing on (SDK and beta headers), without auth or framing."""
    out = {}
    for k, v in headers.items():
        lk = k.lower()
        if lk in _REQUEST_DROP or lk.startswith(("x-flowtrial-", "proxy-", "sec-websocket-")):
            continue
        out[lk] = v
    return out


def forwardable_response_headers(headers: Any) -> list[tuple[str, str]]:
    """Upstream headers worth passing back (request ids, rate limits), without framing."""
    items = headers.items() if hasattr(headers, "items") else headers
    return [(k.lower(), v) for k, v in items if k.lower() not in _RESPONSE_DROP]


class Upstream:
    """Interface: one model endpoint the proxy forwards to."""

    name: str = "upstream"
    credentials: str = "study"  # whose credential it is sent: "study" | "participant"

    async def start(self) -> None:
        """Open connections / clients (idempotent)."""

    async def stop(self) -> None:
        """Close them (idempotent)."""

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> UpstreamReply:
        """Send a request for proxy ``path`` (e.g. ``/v1/chat/completions``)."""
        raise NotImplementedError

    async def models(self, headers: dict[str, str]) -> UpstreamReply:
        """The arm-neutral model list (``GET /v1/models``)."""
        return await self.request("GET", "/v1/models", headers, b"")

    def open_socket(self, headers: dict[str, str]) -> UpstreamSocket:
        """A Responses WebSocket-mode session for one client connection (handshake
        ``headers`` already filtered); connects lazily, on its first turn."""
        raise UpstreamError(501, f"the {self.name} upstream has no Responses WebSocket mode")


class UpstreamSocket:
    """One client connection's Responses WebSocket session with the upstream."""

    async def connect(self) -> None:
        """Make sure the upstream connection is open (raises UpstreamError)."""

    def turn(self, message: dict[str, Any] | str, headers: dict[str, str]
             ) -> AsyncIterator[bytes]:
        """Send one ``response.create`` (a dict, or the JSON text a large one came as) and
        yield the upstream's messages (JSON bytes) up to and including the turn's last
        (terminal or ``error``) event. ``headers`` are the turn's own (e.g. the cycle id),
        for upstreams that take per-turn headers."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the upstream connection (idempotent)."""


class _MockSocket(UpstreamSocket):
    def __init__(self, model: Any, headers: dict[str, str]) -> None:
        self.model = model
        self.headers = headers

    async def turn(self, message: dict[str, Any] | str, headers: dict[str, str]
                   ) -> AsyncIterator[bytes]:
        if isinstance(message, str):  # the simulated model in-process reads it here
            message = json.loads(message)
        async for event in self.model.respond_ws(message, {**self.headers, **headers}):
            yield json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


class MockUpstream(Upstream):
    """The built-in simulated model, called in-process."""

    name = "mock"

    def __init__(self, model: Any = None, *, tokens_per_second: float = 2000.0,
                 ttft_ms: float = 20.0, seed: int = 0, tool_steps: int = 0,
                 answer_tokens: tuple[int, int] | None = None,
                 script: tuple[str, ...] = ()) -> None:
        if model is None:
            from ..mock_model import MockModel

            model = MockModel(tokens_per_second=tokens_per_second, ttft_ms=ttft_ms, seed=seed,
                              tool_steps=tool_steps, answer_tokens=answer_tokens,
                              script=script)
        self.model = model

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> UpstreamReply:
        reply = await self.model.respond(method, path, headers, body)
        body_iter = reply.body

        async def close() -> None:
            aclose = getattr(body_iter, "aclose", None)
            if aclose is not None:
                await aclose()

        return UpstreamReply(reply.status, forwardable_response_headers(reply.headers),
                             body_iter, close)

    def open_socket(self, headers: dict[str, str]) -> UpstreamSocket:
        return _MockSocket(self.model, headers)


class HttpUpstream(Upstream):
    """A real OpenAI- or Anthropic-compatible API, streamed over the lean HTTP/1.1 client of
    :mod:`flowtrial.instrumentation.proxy.http1` (benchmarks/bench_upstream_client.py: it
    against httpx's own client in one run)."""

    def __init__(self, base_url: str, api_key_env: str | None, *,
                 family: Family | str = "openai", timeout_s: float = 600.0,
                 connect_timeout_s: float = 10.0, credentials: str = "study",
                 label: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.family = FAMILIES[family] if isinstance(family, str) else family
        #: "study": the key variable's value goes upstream; "participant": the client's own
        #: credential does (pass-through: the relay adds it), never the study's.
        self.credentials = credentials
        url = httpx.URL(self.base_url)
        self.name = label or f"{self.family.name}:{url.host}"
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._lean: LeanTransport | None = None
        # Where to connect, the Host header and the base path, once.
        https = url.scheme == "https"
        self._key_tuple = (url.scheme, url.host, url.port or (443 if https else 80))
        self._host_header = url.netloc.decode("ascii")
        self._base_path = url.raw_path.decode("ascii").rstrip("/")
        self._scrub_cache: tuple[str | None, Scrubber] | None = None

    async def start(self) -> None:
        if self._lean is None:
            self._lean = LeanTransport()

    async def stop(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
            self._lean = None

    def url_for(self, path: str) -> str:
        return self.base_url + self.family.upstream_path(path)

    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def _scrubber(self) -> Scrubber:
        """The key's scrubber, rebuilt only when the variable's value changes."""
        key = self._key()
        cached = self._scrub_cache
        if cached is None or cached[0] != key:
            cached = self._scrub_cache = (key, Scrubber([key]))
        return cached[1]

    def _auth_headers(self) -> dict[str, str]:
        if not self.api_key_env or self.credentials == "participant":
            return {}
        key = self._key()
        if not key:
            raise UpstreamError(
                502, f"the upstream key variable {self.api_key_env} is not set for the proxy"
            )
        return self.family.auth_headers(key)

    def open_socket(self, headers: dict[str, str]) -> UpstreamSocket:
        if self.family is not OPENAI:
            return super().open_socket(headers)
        url = self.url_for("/v1/responses")
        url = "ws" + url[4:] if url.startswith("http") else url
        return _HttpSocket(url, {**headers, **self._auth_headers()}, self._timeout)

    def _request_headers(self, headers: dict[str, str]) -> dict[str, str]:
        req_headers = {**headers, **self._auth_headers(), "accept-encoding": "identity"}
        for k, v in self.family.default_headers:
            req_headers.setdefault(k, v)
        return req_headers

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> UpstreamReply:
        """The request over the lean transport directly: httpx's client machinery (URL
        merging, cookies, auth and redirect hooks, Request/Response objects) costs ~0.25 ms
        before the request leaves, all of it added TTFT."""
        await self.start()
        assert self._lean is not None
        path = self.family.upstream_path(path)
        try:
            # The base URL's own path (e.g. /v1) comes before the request's.
            head = request_head(method, self._base_path + path, self._host_header,
                                self._request_headers(headers).items(),
                                len(body) if body or method not in ("GET", "HEAD") else None)
        except HeaderInjectionError as exc:
            raise UpstreamError(502, f"not sent upstream: {exc}") from None
        try:
            resp = await self._lean.open(self._key_tuple, method, head + body,
                                         self._timeout.connect, self._timeout.read)
        except httpx.TimeoutException as exc:
            raise UpstreamError(504, f"upstream timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(502, f"upstream unreachable ({type(exc).__name__})") from None
        raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.headers]
        stream = resp.body
        chunks: AsyncIterator[bytes] = stream.__aiter__()
        encoding = next((v.strip().lower() for k, v in raw_headers
                         if k.lower() == "content-encoding"), "identity")
        if encoding not in ("", "identity"):
            # Asked for identity; a server that compresses anyway gets httpx's decoders.
            decoder = httpx.Response(resp.status, headers=raw_headers,
                                     stream=_Stream(chunks))
            chunks = decoder.aiter_bytes()
        return self._reply(resp.status, raw_headers, chunks, stream.aclose)

    def _reply(self, status: int, headers: list[tuple[str, str]], raw: AsyncIterator[bytes],
               close: Callable[[], Awaitable[None]]) -> UpstreamReply:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in raw:
                    yield chunk
            except httpx.TimeoutException as exc:
                raise UpstreamError(504, f"upstream timed out mid-answer ({type(exc).__name__})"
                                    ) from None
            except httpx.HTTPError as exc:
                raise UpstreamError(502, f"upstream connection failed mid-answer "
                                         f"({type(exc).__name__})") from None

        body = chunks()
        scrub = self._scrubber()
        if status >= 400:
            body = _redacted(body, scrub)
        # A header may echo the key too (a debugging gateway, a misconfigured upstream).
        return UpstreamReply(status, scrub.headers(forwardable_response_headers(headers)), body,
                             close)


class _Stream(httpx.AsyncByteStream):
    """An async iterator of body bytes as an httpx stream (for httpx's content decoders)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for c in self._chunks:
            yield c


async def _redacted(body: AsyncIterator[bytes], scrub: Scrubber) -> AsyncIterator[bytes]:
    """An error body whole, with the key redacted (read whole: a key may straddle chunks;
    error bodies are small and every reader joins them anyway)."""
    data = b"".join([c async for c in body])
    if data:
        yield scrub.raw(data)


#: A message to a real upstream longer than this goes as fragments of this size, the loop
#: given way between them: the connection's permessage-deflate compresses on the loop, and
#: a whole 7 MB message of text took 0.2-0.9 s there (benchmarks/bench_socket_messages.py).
FRAGMENT_CHARS = 16 * 1024


async def _fragments(text: str) -> AsyncIterator[str]:
    """``text`` in pieces of :data:`FRAGMENT_CHARS` (whole characters: each piece is valid
    UTF-8), yielding to the loop between them."""
    for i in range(0, len(text), FRAGMENT_CHARS):
        if i:
            await asyncio.sleep(0)
            await give_way()
        yield text[i:i + FRAGMENT_CHARS]


class _HttpSocket(UpstreamSocket):
    """A ``websockets`` client connection to a real Responses WebSocket endpoint."""

    def __init__(self, url: str, headers: dict[str, str], timeout: httpx.Timeout) -> None:
        self.url = url
        self.user_agent = headers.pop("user-agent", None)
        self.headers = headers
        self.timeout = timeout
        self._ws: Any = None

    def _key(self) -> str | None:
        """The key this socket sends (in its handshake headers)."""
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    async def connect(self) -> None:
        await self._connect()

    async def _connect(self) -> Any:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus
        from websockets.protocol import State

        if self._ws is not None and self._ws.state is State.OPEN:
            return self._ws
        try:
            self._ws = await connect(
                self.url, additional_headers=self.headers, user_agent_header=self.user_agent,
                open_timeout=self.timeout.connect, max_size=None, compression="deflate",
                proxy=None,  # never route model traffic through an env-configured proxy
            )
        except TimeoutError:
            raise UpstreamError(504, "upstream WebSocket handshake timed out") from None
        except InvalidStatus as exc:
            status = exc.response.status_code
            # 429 passes on (the client should back off); any other refusal is a bad gateway.
            raise UpstreamError(429 if status == 429 else 502, "upstream refused the WebSocket "
                                f"handshake with HTTP {status}") from None
        except Exception as exc:  # noqa: BLE001 - OSError, InvalidURI ...
            # Redact before cutting: a cut could leave part of a key the scrub then misses.
            detail = Scrubber([self._key()]).text(str(exc))[:200]
            raise UpstreamError(502, f"upstream WebSocket unreachable ({type(exc).__name__}: "
                                     f"{detail})") from None
        return self._ws

    async def turn(self, message: dict[str, Any] | str, headers: dict[str, str]
                   ) -> AsyncIterator[bytes]:
        from websockets.exceptions import ConnectionClosed

        ws = await self._connect()
        complete = False
        text = message if isinstance(message, str) else json.dumps(
            message, ensure_ascii=False, separators=(",", ":"))
        try:
            await ws.send(text if len(text) <= FRAGMENT_CHARS else _fragments(text))
            while True:
                async with asyncio.timeout(self.timeout.read):
                    frame = await ws.recv(decode=False)
                yield frame
                # Cheap pre-check before parsing: only the last event of a turn matters.
                if any(m in frame for m in _TERMINAL_MARKS):
                    try:
                        kind = json.loads(frame).get("type")
                    except (ValueError, AttributeError):
                        kind = None
                    if kind in _TERMINAL_WS:
                        complete = True
                        return
        except TimeoutError:
            raise UpstreamError(504, "upstream timed out mid-answer (WebSocket)") from None
        except ConnectionClosed as exc:
            raise UpstreamError(502, f"upstream WebSocket closed mid-answer ({exc})") from None
        finally:
            if not complete:
                # A turn left unfinished (timeout, malformed event, client gone): the rest of
                # its events may still come, and would be read as the next turn's. Drop the
                # connection (no closing handshake: a stalled peer would not answer it); the
                # next turn opens a new one.
                self.abort()

    def abort(self) -> None:
        """Drop the connection at once (TCP level)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.transport.abort()

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # noqa: BLE001 - closing a dead socket
                pass
