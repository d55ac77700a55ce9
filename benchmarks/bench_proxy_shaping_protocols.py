"""Shaping precision per protocol: Chat (SSE), Anthropic Messages (SSE) and the Responses
WebSocket mode, N concurrent shaped streams each, through a proxy in its own process.

The simulated model runs inside the proxy (``kind = "mock"``; ``--upstream http`` serves it
from a separate process as a real API is — on a 2-core machine that third busy process,
running 100 WebSocket servers' worth of Python, makes its own answers late); answers arrive
whole after its TTFT unless ``--upstream-tps`` is set, so the figures measure
the proxy's shaping. The clients share one connection pool (one light httpx client per
protocol), so the load generator does not starve the proxy of CPU on a small machine. Reported
per protocol from the proxy's own cycle rows: |experienced TTFT − target| (p50 / p99 / max),
the achieved tokens/s error of streams of at least 100 tokens, violations and statuses; and
the lateness of a bare ``asyncio.sleep`` on the same machine (the floor under any timing).

    python benchmarks/bench_proxy_shaping_protocols.py [--streams 50] [--ttft-ms 400]
                                                       [--tps 50] [--rounds 2]
                                                       [--priority -10] [--no-quiet-gc]
                                                       [--pin [--witness]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_proxy_common import (  # noqa: E402
    CpuSteal,
    RunDelay,
    add_shaping_options,
    attribute_misses,
    cpu_seconds,
    enroll_keys,
    mock_model_process,
    percentile,
    pin_load_generator,
    place_proxy,
    proxy_cpu,
    proxy_process,
    proxy_toml,
    shielded_cpu,
    timer_noise,
    upstream_env,
    upstream_section,
    witness_for,
    write_study,
)

STUDY = """
[study]
name = "bench-shaping-protocols"
design = "parallel"
{upstream}
[[arms]]
name = "shaped"
ttft_ms = {ttft}
tokens_per_second = {tps}
[capture]
content = "fingerprint"
"""
PROMPT = "explain python generators in depth {i}"


_clients: dict[str, Any] = {}


def _client() -> Any:
    """One pooled client per event loop (creating one per stream costs ~10 ms of CPU each)."""
    import httpx

    loop = asyncio.get_running_loop()
    key = str(id(loop))
    if key not in _clients:
        _clients.clear()
        _clients[key] = httpx.AsyncClient(timeout=120, limits=httpx.Limits(
            max_connections=1000, max_keepalive_connections=1000))
    return _clients[key]


async def chat(url: str, key: str, i: int) -> None:
    c = _client()
    async with c.stream(
            "POST", url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
            json={"model": "flowtrial-sim-1", "stream": True, "max_tokens": 400,
                  "messages": [{"role": "user", "content": PROMPT.format(i=i)}]}) as r:
        async for _ in r.aiter_raw():
            pass


async def messages(url: str, key: str, i: int) -> None:
    c = _client()
    async with c.stream(
            "POST", url + "/v1/messages", headers={"x-api-key": key,
                                                   "anthropic-version": "2023-06-01"},
            json={"model": "flowtrial-sim-1", "stream": True, "max_tokens": 400,
                  "messages": [{"role": "user", "content": PROMPT.format(i=i)}]}) as r:
        async for _ in r.aiter_raw():
            pass


async def websocket(url: str, key: str, i: int) -> None:
    from websockets.asyncio.client import connect

    async with connect(url.replace("http://", "ws://") + "/v1/responses",
                       additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "flowtrial-sim-1",
                                  "max_output_tokens": 400, "input": PROMPT.format(i=i)}))
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] in ("response.completed", "response.incomplete", "error",
                              "response.failed"):
                return


CLIENTS = {"chat": chat, "messages": messages, "websocket": websocket}


async def load(fn, url: str, keys: list[str], n: int, stagger_ms: float) -> None:
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(fn(url, keys[i % len(keys)], i)))
        await asyncio.sleep(stagger_ms / 1000)
    await asyncio.gather(*tasks)


def summarize(rows: list[tuple]) -> dict:
    ttft_err = [abs(r[0] - r[1]) for r in rows if r[0] is not None]
    long = [r for r in rows if r[4] and r[4] >= 100 and r[2]]
    tps_err = [abs(r[2] - r[3]) / r[3] * 100 for r in long]
    return {
        "cycles": len(rows),
        "ttft_abs_err_ms": {"p50": percentile(ttft_err, 50), "p99": percentile(ttft_err, 99),
                            "max": round(max(ttft_err), 3) if ttft_err else None},
        "tps_err_pct_streams_ge_100_tokens": {
            "n": len(tps_err), "p50": percentile(tps_err, 50), "p99": percentile(tps_err, 99)},
        "violations": sum(1 for r in rows if r[5]),
        "statuses": dict(Counter(r[6] for r in rows)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--ttft-ms", type=float, default=400.0)
    ap.add_argument("--tps", type=float, default=50.0)
    ap.add_argument("--upstream-tps", type=str, default="inf")
    add_shaping_options(ap, upstream="inprocess")
    ap.add_argument("--protocols", default=",".join(CLIENTS),
                    help="comma-separated subset of " + ", ".join(CLIENTS))
    ap.add_argument("--keep-db", type=Path, default=None,
                    help="copy the study database here afterwards (to study single cycles)")
    args = ap.parse_args()
    out: dict = {"streams_concurrent": args.streams, "rounds": args.rounds,
                 "target_ttft_ms": args.ttft_ms, "target_tps": args.tps,
                 "upstream": args.upstream, "quiet_gc": not args.no_quiet_gc}
    pin_load_generator(args)
    with contextlib.ExitStack() as stack:
        d = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        env = None
        if args.upstream == "http":
            mock = stack.enter_context(mock_model_process(20.0, float(args.upstream_tps)))
            upstream, env = upstream_section(mock), upstream_env()
        else:
            upstream = upstream_section(None, args.upstream_tps)
        study = write_study(d, STUDY.format(ttft=args.ttft_ms, tps=args.tps,
                                            upstream=upstream) + proxy_toml(args))
        db = d / "bench.db"
        keys = enroll_keys(study, db, 10)
        with proxy_process(study, db, env) as url:
            place_proxy(args, url.pid)
            witness = witness_for(args)
            out["proxy_cpu_shielded"] = stack.enter_context(shielded_cpu(args)) or None
            misses: dict[str, list[tuple[int, int, float]]] = {}
            steal = CpuSteal()
            delay = RunDelay(url.pid)
            cpu0, t0 = cpu_seconds(url.pid), time.monotonic()
            for name in args.protocols.split(","):
                fn = CLIENTS[name]
                asyncio.run(load(fn, url, keys, 3, 1))  # warm-up
                con = sqlite3.connect(db)
                (start,) = con.execute(
                    "SELECT coalesce(max(t_request_ns), 0) FROM cycles").fetchone()
                con.close()
                gen0, w0 = time.process_time(), time.monotonic()
                for _ in range(args.rounds):
                    asyncio.run(load(fn, url, keys, args.streams, args.stagger_ms))
                gen_cores = (time.process_time() - gen0) / (time.monotonic() - w0)
                con = sqlite3.connect(db)
                rows = list(con.execute(
                    "SELECT experienced_ttft_ms, target_ttft_ms, achieved_tps, target_tps, "
                    "tokens_sent, violation, status, t_request_ns, t_first_sent_ns "
                    "FROM cycles WHERE t_request_ns > ?", (start,)))
                con.close()
                out[name] = summarize(rows)
                out[name]["load_generator_cpu_cores"] = round(gen_cores, 3)
                misses[name] = [(r[7] + int(r[1] * 1e6), r[8], r[0] - r[1]) for r in rows
                                if r[0] is not None and r[8] is not None]
            out["proxy_cpu_cores"] = round((cpu_seconds(url.pid) - cpu0)
                                           / (time.monotonic() - t0), 3)
            out["cpu_steal_pct"] = steal.pct()
            out["proxy_threads_waiting_for_cpu"] = delay.summary()
            if args.keep_db:
                with sqlite3.connect(db) as src, sqlite3.connect(args.keep_db) as dst:
                    src.backup(dst)
            if witness is not None:
                witness.finish()
                out["proxy_cpu_stalls_witnessed"] = witness.summary()
                for name, m in misses.items():
                    out[name]["misses_vs_cpu_stalls"] = attribute_misses(witness, m, 2.0)
        out["proxy_nice"] = args.priority
        out["proxy_pinned_cpu"] = proxy_cpu(args)
        out["bare_asyncio_sleep_lateness_ms_same_machine"] = timer_noise(
            2.0, args.priority, proxy_cpu(args))
    out["cpus"] = os.cpu_count()
    out["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
