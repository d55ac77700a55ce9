"""Test helpers for the proxy: a scripted upstream (exact bytes, exact timing) and SSE builders.

The simulated model covers realistic traffic; these cover what it never does on purpose
(tool calls, unknown fields, stalls, failures mid-stream, hanging sockets).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from flowtrial.instrumentation.proxy.upstream import Upstream, UpstreamError, UpstreamReply

SSE = "text/event-stream; charset=utf-8"


def sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"{head}data: {data}\n\n".encode()


def chat_chunk(delta: dict[str, Any] | None, finish: str | None = None, *,
               extra: dict[str, Any] | None = None, usage: dict[str, Any] | None = None,
               cid: str = "chatcmpl-scripted") -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 1,
                           "model": "scripted", "choices": choices, **(extra or {})}
    if usage is not None:
        obj["usage"] = usage
    return sse(obj)


def chat_stream(texts: list[str], *, extra: dict[str, Any] | None = None,
                usage: dict[str, Any] | None = None) -> list[bytes]:
    """A whole Chat Completions stream: role chunk, one chunk per text, finish, [usage], DONE."""
    out = [chat_chunk({"role": "assistant", "content": ""}, extra=extra)]
    out += [chat_chunk({"content": t}, extra=extra) for t in texts]
    out.append(chat_chunk({}, "stop", extra=extra))
    if usage is not None:
        out.append(chat_chunk(None, usage=usage))
    out.append(b"data: [DONE]\n\n")
    return out


class ScriptedUpstream(Upstream):
    """Answers every request with the same scripted reply.

    ``chunks`` are (delay before it in seconds, bytes); ``fail_after`` raises an
    UpstreamError once the chunks are sent (a connection dying mid-answer).
    """

    name = "scripted"

    def __init__(self, chunks: list[tuple[float, bytes]], *, status: int = 200,
                 content_type: str = SSE, fail_after: UpstreamError | None = None) -> None:
        self.chunks = chunks
        self.status = status
        self.content_type = content_type
        self.fail_after = fail_after
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def request(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> UpstreamReply:
        self.requests.append((path, headers, body))

        async def gen() -> AsyncIterator[bytes]:
            for delay, chunk in self.chunks:
                if delay:
                    await asyncio.sleep(delay)
                yield chunk
            if self.fail_after is not None:
                raise self.fail_after

        return UpstreamReply(self.status, [("content-type", self.content_type),
                                           ("x-request-id", "req_scripted")], gen())

    async def models(self, headers: dict[str, str]) -> UpstreamReply:
        async def gen() -> AsyncIterator[bytes]:
            yield b'{"object":"list","data":[{"id":"scripted","object":"model"}]}'

        return UpstreamReply(200, [("content-type", "application/json")], gen())


def closed_port() -> int:
    """A loopback port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


@contextmanager
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections (kernel backlog) but never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


#: How late a shaped token can be from machine noise alone: on a shared virtual machine the
#: hypervisor can take the CPU for ~10 ms at a time. Lateness beyond it is the proxy's.
MACHINE_NOISE_MS = 25.0


def on_time(row: Any) -> bool:
    """A cycle row with no manipulation violation beyond what machine noise explains (tests
    with a fast upstream: any real miss here would be the proxy's own)."""
    return not row["violation"] or row["violation_ms"] < MACHINE_NOISE_MS
