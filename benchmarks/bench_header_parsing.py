"""CPU time to take in one request head that arrives in many small reads: httptools alone
(what uvicorn does) versus the proxy's front door (held until the blank line, then parsed once).

httptools builds a header value that arrives in pieces by concatenation, so its time grows with
the square of the value's size; the front door searches each read once (plus 3 bytes) and
feeds the parser the whole head, so its time grows linearly. Measured in-process on the
protocol objects (no sockets), the head fed in ``--chunk``-byte reads; sizes stay bounded.

    python benchmarks/bench_header_parsing.py [--chunk 1024] [--sizes 65536,...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httptools


class _Sink:
    """httptools callbacks that keep what uvicorn keeps."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


def _pieces(size: int, chunk: int) -> list[bytes]:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    return [head[i:i + chunk] for i in range(0, len(head), chunk)]


def time_httptools(pieces: list[bytes]) -> float:
    parser = httptools.HttpRequestParser(_Sink())
    t0 = time.perf_counter()
    for p in pieces:
        parser.feed_data(p)
    return time.perf_counter() - t0


def time_front_door(pieces: list[bytes], size: int) -> float:
    """The real GuardedHttpProtocol on a fake transport (its limit set above ``size``)."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from flowtrial.instrumentation.proxy.front_door import (
        FrontDoorStats,
        GuardedHttpProtocol,
        Limits,
    )

    class _Transport(asyncio.Transport):
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

        def write(self, data: Any) -> None:
            pass

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            pass

    async def noop_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    loop = asyncio.new_event_loop()
    try:
        config = Config(noop_app, lifespan="off", log_level="warning", access_log=False)
        config.load()
        limits = Limits(size + 4096, 60.0, 60.0, 60.0, 10)
        proto = GuardedHttpProtocol(config, ServerState(), {}, loop, limits=limits,
                                    stats=FrontDoorStats())
        proto.connection_made(_Transport())
        t0 = time.perf_counter()
        for p in pieces:
            proto.data_received(p)
        took = time.perf_counter() - t0
        assert proto.headers and len(proto.headers[-1][1]) == size, "head not parsed"
        loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop)))
        return took
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--sizes", default="65536,262144,1048576,4194304")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        pieces = _pieces(size, args.chunk)
        # Best of --repeat: this machine is shared, the minimum is the cost itself.
        plain = min(time_httptools(pieces) for _ in range(args.repeat))
        door = min(time_front_door(pieces, size) for _ in range(args.repeat))
        rows.append({"header_bytes": size, "reads": len(pieces),
                     "httptools_ms": round(plain * 1000, 2),
                     "front_door_ms": round(door * 1000, 2),
                     "ratio": round(plain / door, 1)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
