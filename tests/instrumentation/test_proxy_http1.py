"""The proxy's lean HTTP/1.1 upstream transport against real loopback servers."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from flowtrial.instrumentation.proxy.http1 import LeanTransport
from tests.instrumentation.proxy_servers import closed_port, silent_server
from tests.instrumentation.servers import run_asgi_server


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(b"len=%d auth=%s" % (len(body), request.headers.get("authorization", "")
                                         .encode()), media_type="text/plain")


async def _chunks(request: Request) -> StreamingResponse:
    async def gen():
        for i in range(5):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.001)

    return StreamingResponse(gen(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"]),
                        Route("/chunks", _chunks, methods=["GET"])])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with run_asgi_server(APP, timeout_keep_alive=1) as url:
        yield url


class Counting(LeanTransport):
    connects = 0

    async def _connect(self, *args):  # type: ignore[no-untyped-def]
        self.connects += 1
        return await super()._connect(*args)


async def _get(client: httpx.AsyncClient, url: str) -> bytes:
    async with client.stream("GET", url) as r:
        return b"".join([c async for c in r.aiter_bytes()])


def test_keep_alive_reuse_and_stale_connection_retry(server: str) -> None:
    async def go() -> tuple[list[bytes], int, bytes, int]:
        t = Counting()
        async with httpx.AsyncClient(transport=t) as c:
            bodies = [await _get(c, server + "/chunks") for _ in range(3)]
            r = await c.post(server + "/echo", content=b"x" * 1000,
                             headers={"authorization": "Bearer k"})
            used = t.connects
            await asyncio.sleep(1.6)  # the server closes the idle connection (keep-alive 1 s)
            again = await _get(c, server + "/chunks")
            return bodies, used, r.content + again, t.connects

    bodies, used, tail, connects = asyncio.run(go())
    assert bodies == [b"".join(f"data: {i}\n\n".encode() for i in range(5))] * 3
    assert used == 1  # one connection served all four requests
    assert tail.startswith(b"len=1000 auth=Bearer k") and tail.endswith(b"data: 4\n\n")
    assert connects == 2  # the stale one was dropped and a new one made, no error


def test_content_length_and_close_delimited_bodies() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def go() -> bytes:
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        async with srv, httpx.AsyncClient(transport=LeanTransport()) as c:
            return (await c.get(f"http://127.0.0.1:{port}/")).content

    assert asyncio.run(go()) == b"until the end"


def test_errors_map_to_httpx_exceptions() -> None:
    async def go(url: str, timeout: float) -> None:
        async with httpx.AsyncClient(transport=LeanTransport(), timeout=timeout) as c:
            await c.get(url)

    with pytest.raises(httpx.ConnectError):
        asyncio.run(go(f"http://127.0.0.1:{closed_port()}/", 2))
    with silent_server() as port, pytest.raises(httpx.ReadTimeout):
        asyncio.run(go(f"http://127.0.0.1:{port}/", 0.2))


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_upstream(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")  # only to make a throwaway certificate
    cert, key = _self_signed(tmp_path)
    with run_asgi_server(APP, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        https = url.replace("http://127.0.0.1", "https://localhost")
        ctx = ssl.create_default_context(cafile=str(cert))

        async def go() -> tuple[bytes, int]:
            t = Counting(ssl_context=ctx)
            async with httpx.AsyncClient(transport=t) as c:
                first = await _get(c, https + "/chunks")
                await _get(c, https + "/chunks")
                return first, t.connects

        t0 = time.monotonic()
        body, connects = asyncio.run(go())
    assert body.endswith(b"data: 4\n\n") and connects == 1
    assert time.monotonic() - t0 < 10

    async def untrusted() -> None:
        async with httpx.AsyncClient(transport=LeanTransport()) as c:
            await c.get(https + "/chunks")

    with run_asgi_server(APP, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        https = url.replace("http://127.0.0.1", "https://localhost")
        with pytest.raises(httpx.ConnectError):  # certificate not trusted: refused
            asyncio.run(untrusted())


async def _capture_chat(request: Request) -> Response:
    """Answers a chat stream gzip-compressed (against the proxy's accept-encoding: identity)
    and echoes what it received in the first content delta."""
    import gzip
    import json

    body = await request.body()
    seen = {"path": request.url.path, "query": request.url.query,
            "host": request.headers.get("host"), "auth": request.headers.get("authorization"),
            "length": request.headers.get("content-length"), "body_ok": len(body) > 0,
            "accept_encoding": request.headers.get("accept-encoding"),
            "beta": request.headers.get("openai-beta")}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": {"content": json.dumps(seen)},
                          "finish_reason": None}]}
    stream = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    return Response(gzip.compress(stream), media_type="text/event-stream",
                    headers={"content-encoding": "gzip"})


def test_lean_upstream_request_line_headers_and_compressed_answer(tmp_path, monkeypatch
                                                                  ) -> None:
    """HttpUpstream's lean path (no httpx client): the base URL's path, the query, the Host
    header with its port, the upstream key instead of the participant's, a Content-Length —
    and a compressed answer decoded for the client."""
    import json

    from flowtrial.instrumentation.proxy.upstream import HttpUpstream

    app = Starlette(routes=[Route("/base/v1/chat/completions", _capture_chat,
                                 methods=["POST"])])
    monkeypatch.setenv("FT_TEST_UPSTREAM_KEY", "sk-upstream-secret-123")
    with run_asgi_server(app) as url:
        up = HttpUpstream(url + "/base/v1", "FT_TEST_UPSTREAM_KEY")

        async def go() -> tuple[int, bytes]:
            try:
                reply = await up.request(
                    "POST", "/v1/chat/completions?api-version=2", {
                        "content-type": "application/json", "openai-beta": "x=1"},
                    b'{"model": "m", "stream": true}')
                data = b"".join([c async for c in reply.body])
                await reply.close()
                return reply.status, data
            finally:
                await up.stop()

        status, data = asyncio.run(go())
    assert status == 200
    first = json.loads(data.split(b"\n\n")[0][6:])
    seen = json.loads(first["choices"][0]["delta"]["content"])
    assert seen == {"path": "/base/v1/chat/completions", "query": "api-version=2",
                    "host": url.split("//", 1)[1], "auth": "Bearer sk-upstream-secret-123",
                    "length": str(len(b'{"model": "m", "stream": true}')), "body_ok": True,
                    "accept_encoding": "identity", "beta": "x=1"}
    assert data.endswith(b"data: [DONE]\n\n")


def test_interim_1xx_responses_are_skipped_for_the_final_one() -> None:
    """A server that sends 100 Continue and 103 Early Hints before its answer (RFC 9110
    §15.2): the transport returns the final 200 with its body, never a 1xx."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
                     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
                     b"final")
        await writer.drain()
        writer.close()

    async def main() -> tuple[int, bytes, str | None]:
        srv = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        async with srv, httpx.AsyncClient(transport=LeanTransport()) as client:
            r = await client.post(f"http://127.0.0.1:{port}/x", content=b"{}",
                                  headers={"expect": "100-continue"})
            return r.status_code, r.content, r.headers.get("link")

    status, body, link = asyncio.run(main())
    assert (status, body, link) == (200, b"final", None)


@pytest.mark.parametrize(("part", "args"), [
    ("value", ("POST", "/v1/x", "h", [("x-a", "ok\r\nx-evil: 1")], 0)),
    ("value", ("POST", "/v1/x", "h", [("x-a", "ok\nx-evil: 1")], 0)),
    ("value", ("POST", "/v1/x", "h", [("x-a", "ok\0")], 0)),
    ("name", ("POST", "/v1/x", "h", [("x-a\r\nx-evil", "1")], 0)),
    ("target", ("POST", "/v1/x HTTP/1.1\r\nx-evil: 1\r\n\r\nGET /", "h", [], 0)),
    ("host", ("GET", "/", "h\r\nx-evil: 1", [], None)),
])
def test_request_heads_refuse_line_breaks(part: str, args: tuple) -> None:
    """Header injection: no part of a request head may carry CR, LF or NUL."""
    from flowtrial.instrumentation.proxy.http1 import HeaderInjectionError, request_head

    with pytest.raises(HeaderInjectionError) as exc:
        request_head(*args)
    assert "x-evil" not in str(exc.value) and "ok" not in str(exc.value)  # values not echoed
    head = request_head("POST", "/v1/x", "h:1", [("x-a", "ok"), ("content-length", "9")], 3)
    assert head == b"POST /v1/x HTTP/1.1\r\nhost: h:1\r\nx-a: ok\r\ncontent-length: 3\r\n\r\n"


def test_an_upstream_key_with_a_line_break_is_never_sent(monkeypatch) -> None:
    """A key variable holding CR/LF (a pasted file) cannot inject headers: the request fails
    with an UpstreamError that does not quote the key, and the server sees no request."""
    from flowtrial.instrumentation.proxy.upstream import HttpUpstream, UpstreamError

    seen: list[str] = []

    async def capture(request: Request) -> Response:
        seen.append(request.url.path)
        return Response(b"{}", media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", capture, methods=["POST"])])
    monkeypatch.setenv("FT_TEST_UPSTREAM_KEY", "sk-secret\r\nx-evil: 1")
    with run_asgi_server(app) as url:
        up = HttpUpstream(url + "/v1", "FT_TEST_UPSTREAM_KEY")

        async def go() -> UpstreamError:
            try:
                with pytest.raises(UpstreamError) as exc:
                    await up.request("POST", "/v1/chat/completions", {}, b"{}")
                # The same upstream still serves a clean request afterwards.
                monkeypatch.setenv("FT_TEST_UPSTREAM_KEY", "sk-secret")
                reply = await up.request("POST", "/v1/chat/completions", {}, b"{}")
                await reply.close()
                return exc.value
            finally:
                await up.stop()

        err = asyncio.run(go())
    assert err.status == 502 and "authorization" in err.message
    assert "sk-secret" not in err.message and "x-evil" not in err.message
    assert seen == ["/v1/chat/completions"]  # only the clean one arrived
