"""A real model server on a free loopback port that misbehaves at the socket level on demand.

It answers like the simulated model (every protocol, HTTP/1.1 keep-alive, chunked streams,
and the Responses WebSocket mode on the same port), except when a request asks for a fault —
with an ``x-fault`` header or an ``x_fault`` body field (removed before the model sees the
body), or, for a WebSocket turn, an ``x_fault`` field in the ``response.create`` message:

=================== =========================================================================
``die:N``           send N body chunks, then half a chunk, then close the TCP connection
``reset:N``         the same, but the close is a TCP reset (RST)
``stall:N``         send N body chunks, then nothing (until the peer gives up)
``badjson:N``       after N chunks, one event whose JSON is cut short, then the rest
``noise:N``         after N chunks, SSE lines without data (comments, unknown fields, junk)
``early_end:N``     N chunks, then a clean end of the chunked body (no final event)
``cut_clean:N``     no Content-Length/chunking (close-delimited): N chunks, then a clean close
``ctype:T``         the normal answer with ``content-type: T``
``json_for_stream`` a streaming request answered with the non-streaming JSON body
``badbody``         200 ``application/json`` whose JSON is cut short
``status:S``        status S with the protocol's JSON error body and ``retry-after: 7``
``echo_key:S``      status S with the protocol's JSON error body whose message quotes the API
                    key the request carried (``Authorization: Bearer`` / ``x-api-key``) and
                    the request body, as an upstream refusing a key may
``echo_key_escaped:S`` as ``echo_key:S``, the key in the JSON spelled with ``\\uXXXX`` escapes
``echo_key_header`` the model's normal answer, with a response header quoting the key
``echo_key_sse:N``  a streaming answer: N events, then the protocol's error event quoting the
                    key and the request body, then the end of the body
``html:S``          status S with an HTML body (what a load balancer sends)
``close``           read the request, close without answering
``hang``            read the request, never answer (until the peer gives up)
``not_http``        answer bytes that are not HTTP
=================== =========================================================================

For the WebSocket handshake, ``x-fault: status:S`` refuses the upgrade with status S; a
turn's ``x_fault: echo_key:N`` sends N events, then an ``error`` event (status 500) quoting
the handshake's key and the turn's message, and ends the turn there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from flowtrial.instrumentation.mock_model import MockModel

__all__ = ["FaultyUpstream", "faulty_upstream"]

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_REASONS = {200: "OK", 101: "Switching Protocols", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
            529: "Overloaded"}


def _fault_arg(fault: str) -> tuple[str, str]:
    name, _, arg = fault.partition(":")
    return name, arg


def _key_of(headers: dict[str, str]) -> str:
    """The API key a request carried (``Authorization: Bearer`` or ``x-api-key``)."""
    auth = headers.get("authorization", "")
    return auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")


def _echo(headers: dict[str, str], request: bytes) -> str:
    """An error message that quotes the key the request carried and the request itself."""
    key = _key_of(headers)
    return (f"Incorrect API key provided: {key}. Request was: "
            f"{request.decode('utf-8', 'replace')}")


def _error_json(path: str, status: int, message: str) -> bytes:
    """The protocol's JSON error body for ``path``."""
    if path.startswith("/v1/messages"):
        kind = {401: "authentication_error", 429: "rate_limit_error",
                529: "overloaded_error"}.get(status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}
                          ).encode()
    kind = {401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": "invalid_api_key" if status == 401 else None}}).encode()


def _sse_error(path: str, message: str, seq: int) -> bytes:
    """The protocol's in-stream error event for ``path`` (``seq``: Responses' next number)."""
    if path.startswith("/v1/messages"):
        return b"event: error\ndata: " + json.dumps({"type": "error", "error": {
            "type": "api_error", "message": message}}).encode() + b"\n\n"
    if path.startswith("/v1/responses"):
        return b"event: error\ndata: " + json.dumps({
            "type": "error", "code": "server_error", "message": message, "param": None,
            "sequence_number": seq}).encode() + b"\n\n"
    return b"data: " + json.dumps({"error": {"message": message, "type": "server_error",
                                            "param": None, "code": None}}).encode() + b"\n\n"


class FaultyUpstream:
    """See the module docstring. ``requests`` lists (path, fault) as they arrive."""

    def __init__(self, tokens_per_second: float = 1000.0, ttft_ms: float = 1.0) -> None:
        self.model = MockModel(tokens_per_second=tokens_per_second, ttft_ms=ttft_ms)
        self.requests: list[tuple[str, str]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="faulty-upstream")
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def _stop() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.close()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # ------------------------------------------------------------------ HTTP
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        if headers.get("upgrade", "").lower() == "websocket":
            await self._websocket(reader, writer, path, headers)
            return False
        fault = headers.get("x-fault", "")
        if body:
            try:
                obj = json.loads(body)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and "x_fault" in obj:
                fault = str(obj.pop("x_fault"))
                body = json.dumps(obj).encode()
        self.requests.append((path, fault))
        return await self._answer(reader, writer, method, path, headers, body, fault)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      method: str, path: str, headers: dict[str, str], body: bytes,
                      fault: str) -> bool:
        name, arg = _fault_arg(fault)
        if name == "close":
            return False
        if name == "hang":
            await self._until_closed(reader)
            return False
        if name == "not_http":
            writer.write(b"this is not HTTP at all\r\n\r\n")
            await writer.drain()
            return False
        if name in ("status", "html", "echo_key", "echo_key_escaped"):
            status = int(arg)
            if name == "html":
                out, ctype = b"<html><body><h1>Bad gateway</h1></body></html>", "text/html"
            else:
                message = _echo(headers, body) if name.startswith("echo") else f"scripted {status}"
                out, ctype = _error_json(path, status, message), "application/json"
                if name == "echo_key_escaped":
                    key = _key_of(headers)
                    out = out.replace(key.encode(), "".join(
                        f"\\u{ord(c):04x}" for c in key).encode())
            self._head(writer, status, ctype, {"content-length": str(len(out)),
                                               "retry-after": "7"})
            writer.write(out)
            await writer.drain()
            return True
        hdrs = {k: v for k, v in headers.items() if k != "x-fault"}
        if name == "json_for_stream":
            obj = json.loads(body)
            obj["stream"] = False
            body = json.dumps(obj).encode()
        reply = await self.model.respond(method, path, hdrs, body)
        ctype = arg if name == "ctype" else reply.headers.get("content-type", "")
        if name == "badbody":
            out = b'{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [{"ind'
            self._head(writer, 200, "application/json", {"content-length": str(len(out))})
            writer.write(out)
            await writer.drain()
            return True
        stream = reply.headers.get("content-type", "").startswith("text/event-stream")
        echo = {"x-echo-auth": "Bearer " + _key_of(headers)} if name == "echo_key_header" else {}
        if not stream:
            out = await reply.read()
            if name in ("die", "reset"):
                self._head(writer, reply.status, ctype, {"content-length": str(len(out))})
                writer.write(out[: len(out) // 2])
                await writer.drain()
                self._kill(writer, name == "reset")
                return False
            if name == "stall":
                self._head(writer, reply.status, ctype, {"content-length": str(len(out))})
                await writer.drain()
                await self._until_closed(reader)
                return False
            self._head(writer, reply.status, ctype, {"content-length": str(len(out)), **echo})
            writer.write(out)
            await writer.drain()
            return True
        n = int(arg) if arg.isdigit() else 0
        if name == "cut_clean":
            self._head(writer, reply.status, ctype, {"connection": "close"})
        else:
            self._head(writer, reply.status, ctype, {"transfer-encoding": "chunked", **echo})
        sent = 0
        async for chunk in _chunks(reply.body):
            if name in ("die", "reset", "stall", "early_end", "cut_clean") and sent == n:
                if name in ("die", "reset"):
                    writer.write(b"%x\r\n" % (len(chunk) + 100) + chunk[: len(chunk) // 2])
                    await writer.drain()
                    self._kill(writer, name == "reset")
                elif name == "stall":
                    await writer.drain()
                    await self._until_closed(reader)
                elif name == "early_end":
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return True
                return False
            if name == "badjson" and sent == n:
                self._chunk(writer, b'data: {"id": "x", "choices": [{"index": 0, "delta": '
                                    b'{"content": "cut sho\n\n', name)
            if name == "echo_key_sse" and sent == n:
                self._chunk(writer, _sse_error(path, _echo(headers, body), n), name)
                break
            if name == "noise" and sent == n:
                self._chunk(writer, b": a comment line\n\nid: 17\n\nretry: 100\n\n"
                                    b"junk without a colon\n\n", name)
            self._chunk(writer, chunk, name)
            await writer.drain()
            sent += 1
        if name == "cut_clean":
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    @staticmethod
    def _head(writer: asyncio.StreamWriter, status: int, ctype: str,
              extra: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
                 f"content-type: {ctype}", "x-request-id: req_faulty"]
        lines += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes, fault: str) -> None:
        if fault == "cut_clean":
            writer.write(data)
        else:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    @staticmethod
    def _kill(writer: asyncio.StreamWriter, reset: bool) -> None:
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()

    @staticmethod
    async def _until_closed(reader: asyncio.StreamReader, cap_s: float = 30.0) -> None:
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(cap_s):
                while await reader.read(65536):
                    pass

    # ------------------------------------------------------------------ WebSocket
    async def _websocket(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         path: str, headers: dict[str, str]) -> None:
        fault = headers.get("x-fault", "")
        self.requests.append(("ws:" + path, fault))
        name, arg = _fault_arg(fault)
        if name == "status":
            out = json.dumps({"error": {"message": f"scripted {arg}"}}).encode()
            self._head(writer, int(arg), "application/json",
                       {"content-length": str(len(out)), "retry-after": "7"})
            writer.write(out)
            await writer.drain()
            return
        accept = base64.b64encode(hashlib.sha1(
            headers["sec-websocket-key"].encode() + _WS_GUID).digest()).decode()
        writer.write(("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                      f"connection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n")
                     .encode())
        await writer.drain()
        while True:
            frame = await _ws_read(reader)
            if frame is None:
                return
            opcode, payload = frame
            if opcode == 0x8:  # close
                writer.write(b"\x88\x02\x03\xe8")
                await writer.drain()
                return
            if opcode == 0x9:  # ping -> pong
                writer.write(_ws_frame(payload, 0xA))
                continue
            if opcode != 0x1:
                continue
            message = json.loads(payload)
            tfault = str(message.pop("x_fault", "") or "")
            self.requests.append(("ws-turn:" + path, tfault))
            tname, targ = _fault_arg(tfault)
            n = int(targ) if targ.isdigit() else 0
            sent = 0
            async for event in self.model.respond_ws(message, headers):
                if tname == "echo_key" and sent == n:
                    writer.write(_ws_frame(json.dumps({"type": "error", "status": 500, "error": {
                        "type": "server_error", "code": "server_error", "param": None,
                        "message": _echo(headers, json.dumps(message).encode())}}).encode()))
                    await writer.drain()
                    break
                if tname in ("die", "stall") and sent == n:
                    if tname == "die":
                        writer.write(b"\x81\x7e\x01\x00" + b'{"type": "resp')  # half a frame
                        await writer.drain()
                        writer.transport.abort()
                    else:
                        await self._until_closed(reader)
                    return
                if tname == "badjson" and sent == n:
                    writer.write(_ws_frame(b'{"type": "response.output_text.delta", "del'))
                writer.write(_ws_frame(json.dumps(event).encode()))
                await writer.drain()
                sent += 1


async def _chunks(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The model's body, one SSE event per chunk (so ``N`` counts events)."""
    buf = b""
    async for data in body:
        buf += data
        while (i := buf.find(b"\n\n")) >= 0:
            yield buf[: i + 2]
            buf = buf[i + 2:]
    if buf:
        yield buf


def _ws_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


async def _ws_read(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """One client frame (masked; no fragmentation, as the proxy sends), or None at EOF."""
    try:
        b0, b1 = await reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await reader.readexactly(8))
        mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
        data = await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return b0 & 0x0F, bytes(c ^ mask[i % 4] for i, c in enumerate(data))


@contextlib.contextmanager
def faulty_upstream(**kwargs: Any) -> Iterator[FaultyUpstream]:
    """A started :class:`FaultyUpstream`, stopped on exit."""
    up = FaultyUpstream(**kwargs)
    up.start()
    try:
        yield up
    finally:
        up.stop()
