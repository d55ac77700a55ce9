"""The proxy's hand-written upstream HTTP/1.1 client against httpx's own, in one run.

The simulated model is served over loopback HTTP (as ``flowtrial mock-model``, TTFT 0, in its
own process). This process streams the same chat request from it with N concurrent streams per
round, rounds alternating between the two clients:

- ``lean``: :class:`~flowtrial.instrumentation.proxy.upstream.HttpUpstream` as the proxy uses
  it (the head from ``http1.request_head``, httptools parsing, keep-alive pool);
- ``httpx``: ``httpx.AsyncClient`` (its default transport: httpcore + h11), streaming the
  same request with the same headers.

Reported per client: CPU µs this process spends per request (``time.process_time`` over
the round, divided by its requests: each is the same 64-token answer) and per upstream event
(less fair: the model coalesces tokens per write when it is busy, so the faster client reads
fewer, larger events), and the time from sending the request to its first body byte
(median, p99: the latency the client adds to TTFT, the server's share being the same for
both). The machine's floor is printed first: the lateness of a bare
``asyncio.sleep`` right now (``timer_noise``). ``ratio`` = httpx / lean.

    python benchmarks/bench_upstream_client.py [--streams 50] [--rounds 6] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_proxy_common import (  # noqa: E402
    BENCH_KEY_ENV,
    mock_model_process,
    percentile,
    timer_noise,
)
from flowtrial.instrumentation.proxy.upstream import HttpUpstream  # noqa: E402

_PATH = "/v1/chat/completions"


def _body(i: int, tokens: int) -> bytes:
    return json.dumps({"model": "flowtrial-sim-1", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user",
                                     "content": f"reverse a list in python {i}"}]}).encode()


async def _lean_stream(up: HttpUpstream, body: bytes) -> tuple[float, int]:
    t0 = time.perf_counter()
    reply = await up.request("POST", _PATH, {"content-type": "application/json"}, body)
    first = None
    events = 0
    try:
        async for chunk in reply.body:
            if first is None:
                first = time.perf_counter()
            events += chunk.count(b"data:")
    finally:
        await reply.close()
    assert first is not None
    return (first - t0) * 1e3, events


async def _httpx_stream(client: httpx.AsyncClient, url: str, body: bytes,
                        key: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}",
               "accept-encoding": "identity"}
    for attempt in (0, 1):
        first = None
        events = 0
        try:
            async with client.stream("POST", url, content=body, headers=headers) as r:
                async for chunk in r.aiter_raw():
                    if first is None:
                        first = time.perf_counter()
                    events += chunk.count(b"data:")
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A keep-alive connection the model closed while idle: the lean client retries
            # such a request once too.
            if attempt or first is not None:
                raise
            continue
        break
    assert first is not None
    return (first - t0) * 1e3, events


async def _round(kind: str, n: int, tokens: int, r: int, up: HttpUpstream,
                 client: httpx.AsyncClient, url: str, key: str) -> tuple[float, list[float], int]:
    bodies = [_body(r * n + i, tokens) for i in range(n)]
    cpu0 = time.process_time()
    if kind == "lean":
        got = await asyncio.gather(*[_lean_stream(up, b) for b in bodies])
    else:
        got = await asyncio.gather(*[_httpx_stream(client, url + _PATH[3:], b, key)
                                     for b in bodies])
    cpu = time.process_time() - cpu0
    events = sum(e for _, e in got)
    return cpu, [t for t, _ in got], events


async def _run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    key = os.environ[BENCH_KEY_ENV]
    up = HttpUpstream(url, BENCH_KEY_ENV)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.streams)
    client = httpx.AsyncClient(timeout=60, limits=limits, trust_env=False)
    stats: dict[str, dict[str, Any]] = {k: {"cpu": 0.0, "events": 0, "ttfb": []}
                                        for k in ("lean", "httpx")}
    try:
        for kind in ("lean", "httpx"):  # warm both pools and code paths
            await _round(kind, args.streams, args.tokens, 0, up, client, url, key)
        for r in range(args.rounds):
            order = ("lean", "httpx") if r % 2 == 0 else ("httpx", "lean")
            for kind in order:
                cpu, ttfb, events = await _round(kind, args.streams, args.tokens, r + 1, up,
                                                 client, url, key)
                s = stats[kind]
                s["cpu"] += cpu
                s["events"] += events
                s["ttfb"] += ttfb
    finally:
        await up.stop()
        await client.aclose()
    out: dict[str, Any] = {}
    for kind, s in stats.items():
        out[kind] = {
            "cpu_us_per_event": round(s["cpu"] / max(1, s["events"]) * 1e6, 2),
            "cpu_us_per_request": round(s["cpu"] / max(1, len(s["ttfb"])) * 1e6, 1),
            "events": s["events"],
            "ttfb_ms_p50": round(percentile(s["ttfb"], 50), 3),
            "ttfb_ms_p99": round(percentile(s["ttfb"], 99), 3),
        }
    out["ratio_httpx_over_lean"] = {
        "cpu_per_event": round(out["httpx"]["cpu_us_per_event"]
                               / out["lean"]["cpu_us_per_event"], 2),
        "cpu_per_request": round(out["httpx"]["cpu_us_per_request"]
                                 / out["lean"]["cpu_us_per_request"], 2),
        "ttfb_p50": round(out["httpx"]["ttfb_ms_p50"] / out["lean"]["ttfb_ms_p50"], 2),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model-tps", type=float, default=200.0,
                    help="the simulated model's pace: slow enough that it writes every token "
                         "as its own event for both clients (a busy model coalesces them)")
    args = ap.parse_args()
    os.environ.setdefault(BENCH_KEY_ENV, "sk-bench")
    floor = timer_noise(1.0)
    print(json.dumps({"machine_floor": floor}, indent=2), flush=True)
    with mock_model_process(0.0, args.model_tps) as url:
        result = _run_sync(url, args)
    result.update({"streams": args.streams, "rounds": args.rounds, "tokens": args.tokens,
                   "model_tps": args.model_tps,
                   "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]})
    print(json.dumps(result, indent=2))


def _run_sync(url: str, args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_run(url, args))


if __name__ == "__main__":
    main()
