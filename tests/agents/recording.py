"""Records what agents send: an ASGI wrapper logging every request and what went back (HTTP
bodies, WebSocket frames), and a trap that catches any attempt to reach the internet."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OutboundTrap", "RecordedRequest", "RequestLog", "answer_text"]

Scope = dict[str, Any]
Message = dict[str, Any]


@dataclass
class RecordedRequest:
    """One HTTP request or one WebSocket connection as the server saw it."""

    kind: str  # "http" or "websocket"
    method: str  # HTTP method, or "WS" for a WebSocket connection
    path: str
    query: str
    headers: dict[str, str]
    body: bytes = b""
    status: int | None = None  # HTTP status sent back; 101 once a WebSocket is accepted
    frames: list[str] = field(default_factory=list)  # WebSocket text frames received
    response: bytes = b""  # HTTP response body sent back
    sent: list[str] = field(default_factory=list)  # WebSocket text frames sent back

    @property
    def json(self) -> Any:
        """The body decoded as JSON (None when empty or not JSON)."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    @property
    def messages(self) -> list[Any]:
        """The WebSocket frames decoded as JSON (undecodable frames as raw strings)."""
        out: list[Any] = []
        for frame in self.frames:
            try:
                out.append(json.loads(frame))
            except ValueError:
                out.append(frame)
        return out

    @property
    def answer(self) -> str:
        """The model's answer text this request got back (any protocol, streamed or not)."""
        if self.kind == "websocket":
            return answer_text(self.sent)
        events = []
        for line in self.response.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
        return answer_text(events or [self.response.decode("utf-8", "replace")])


def answer_text(payloads: list[str]) -> str:
    """Collect answer text from JSON payloads (SSE data lines, WebSocket frames or one body)
    of the Responses, Anthropic Messages or Chat Completions protocols."""
    done: list[str] = []
    deltas: list[str] = []
    for payload in payloads:
        try:
            event = json.loads(payload)
        except ValueError:
            continue  # e.g. "[DONE]"
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        delta = event.get("delta")
        if kind == "response.output_text.done":
            done.append(event.get("text", ""))
        elif kind == "content_block_delta" and isinstance(delta, dict):
            deltas.append(delta.get("text", "") if delta.get("type") == "text_delta" else "")
        elif kind == "message":  # a non-streaming Anthropic message
            deltas.extend(b.get("text", "") for b in event.get("content", []))
        for choice in event.get("choices") or []:  # Chat Completions, streamed or not
            part = choice.get("delta") or choice.get("message") or {}
            deltas.append(part.get("content") or "")
    return "".join(done) if done else "".join(deltas)


class RequestLog:
    """Wrap an ASGI app; every request passing through is appended to `self.requests`.

    Thread-safe enough for the tests: the server runs in its own thread and the test reads
    the list after the agent process has exited.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def http(self, path_suffix: str | None = None) -> list[RecordedRequest]:
        """Recorded HTTP requests (those whose path ends with `path_suffix`, if given)."""
        return [r for r in self.requests if r.kind == "http"
                and (path_suffix is None or r.path.endswith(path_suffix))]

    def websockets(self) -> list[RecordedRequest]:
        """Recorded WebSocket connections."""
        return [r for r in self.requests if r.kind == "websocket"]

    def summary(self) -> str:
        """One line per request: for test failure messages and the report."""
        lines = []
        for r in self.requests:
            extra = f" frames={len(r.frames)}" if r.kind == "websocket" else ""
            lines.append(f"{r.method} {r.path} -> {r.status}{extra}")
        return "\n".join(lines) or "(no requests)"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        record = RecordedRequest(
            kind=scope["type"],
            method=scope.get("method", "WS") if scope["type"] == "http" else "WS",
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers={k.decode("latin-1").lower(): v.decode("latin-1")
                     for k, v in scope.get("headers", [])},
        )
        with self._lock:
            self.requests.append(record)

        async def logged_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                record.body += message.get("body", b"")
            elif message["type"] == "websocket.receive":
                text = message.get("text")
                if text is None:
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                record.frames.append(text)
            return message

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body":
                record.response += message.get("body", b"")
            elif message["type"] == "websocket.send" and message.get("text") is not None:
                record.sent.append(message["text"])
            elif message["type"] == "websocket.accept":
                record.status = 101
            elif message["type"] == "websocket.close" and record.status is None:
                record.status = 403  # closed before accepting: the handshake was refused
            await send(message)

        await self.app(scope, logged_receive, logged_send)


class OutboundTrap:
    """A loopback stand-in for an HTTP(S) proxy that refuses every request and notes it.

    Agents run with HTTP(S)_PROXY pointing here (and NO_PROXY covering loopback), so any
    attempt to reach a host other than the server under test lands here instead of the
    network: it is answered 403 at once (nothing hangs on a closed network) and listed in
    `attempts` as its request line, e.g. ``CONNECT api.github.com:443 HTTP/1.1``.
    """

    def __init__(self) -> None:
        import socketserver

        trap = self
        self.attempts: list[str] = []

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5)
                data = b""
                try:
                    while b"\r\n" not in data and len(data) < 65536:
                        chunk = self.request.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    line = data.split(b"\r\n", 1)[0].decode("latin-1")
                    with trap._lock:
                        trap.attempts.append(line or "(empty request)")
                    self.request.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n"
                                         b"Connection: close\r\n\r\n")
                except OSError:
                    pass

        self._lock = threading.Lock()
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True, name="outbound-trap")

    def env(self) -> dict[str, str]:
        """Proxy variables sending everything but loopback to the trap."""
        names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        env = {name: self.url for name in names} | {n.lower(): self.url for n in names}
        no_proxy = "127.0.0.1,localhost,::1"
        return env | {"NO_PROXY": no_proxy, "no_proxy": no_proxy}

    def __enter__(self) -> OutboundTrap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
