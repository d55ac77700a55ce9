"""Shaping precision under load: many concurrent shaped streams through the proxy.

The proxy runs in its own process with the simulated model as a separate HTTP server (as a
real API is; ``--upstream inprocess`` puts it inside the proxy); N concurrent streaming chat
requests come from a light raw-socket client in this process. Reported from the proxy's own
cycle rows: |experienced TTFT − target| (p50 / p99 / max) and the achieved tokens/s error of
streams of at least 100 tokens; the TTFT error seen by the client; violations; the proxy's
CPU; and the lateness of a bare ``asyncio.sleep`` on the same machine, the floor under any
event-loop timing.

Targets: p99 |TTFT error| ≤ 2 ms with 50–100 streams; tokens/s within 2 %.

    python benchmarks/bench_proxy_shaping.py [--streams 100] [--ttft-ms 400] [--tps 50]
                                             [--answer-tokens 2000] [--min-tokens 300]
                                             [--frame-ms 8] [--priority -10]
                                             [--pin [--witness]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

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

CONTENT = re.compile(rb'"content":"[^"]')
CYCLE = re.compile(rb"x-flowtrial-cycle-id: (\S+)\r\n")
STUDY = """
[study]
name = "bench-shaping"
design = "parallel"
{upstream}
[[arms]]
name = "shaped"
ttft_ms = {ttft}
tokens_per_second = {tps}
{frame}[capture]
content = "fingerprint"
"""


async def one_stream(host: str, port: int, key: str, i: int, max_tokens: int = 400
                     ) -> tuple[str, float | None, bool]:
    """One streaming chat request over a raw socket: a light client, so 100 of them do not
    load the machine the proxy's timing is measured on."""
    body = json.dumps({
        "model": "flowtrial-sim-1", "stream": True, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"explain python generators in depth {i}"}],
    }).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + body)
    first = None
    buf = b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        if first is None and CONTENT.search(data):
            first = (time.perf_counter() - t0) * 1000
        buf += data
    writer.close()
    cid = CYCLE.search(buf)
    return (cid.group(1).decode() if cid else ""), first, b"data: [DONE]" in buf


async def load(url: str, keys: list[str], n: int, stagger_ms: float, max_tokens: int = 400
               ) -> list:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one_stream(host, int(port), keys[i % len(keys)], i,
                                                    max_tokens)))
        await asyncio.sleep(stagger_ms / 1000)
    return await asyncio.gather(*tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--ttft-ms", type=float, default=400.0)
    ap.add_argument("--tps", type=float, default=50.0)
    ap.add_argument("--upstream-tps", type=float, default=float("inf"),
                    help="the simulated model's own pace (default inf: each answer arrives "
                         "whole after the model's TTFT, so the figures measure the proxy's "
                         "shaping rather than the model's own pacing)")
    ap.add_argument("--answer-tokens", type=int, default=None,
                    help="every answer of the simulated model this many tokens long (its "
                         "answer_tokens setting; default: the corpus answers, capped at 400)")
    ap.add_argument("--min-tokens", type=int, default=100,
                    help="the rate error counts streams of at least this many tokens")
    ap.add_argument("--frame-ms", type=float, default=None,
                    help="the arm's frame_ms (0: one write per token; default: the arm's "
                         "default)")
    add_shaping_options(ap, upstream="http")
    args = ap.parse_args()
    pin_load_generator(args)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        d = Path(tmp)
        env = None
        if args.upstream == "http":
            mock = stack.enter_context(mock_model_process(20.0, args.upstream_tps,
                                                          args.answer_tokens))
            upstream, env = upstream_section(mock), upstream_env()
        else:
            upstream = upstream_section(None, args.upstream_tps, args.answer_tokens)
        frame = "" if args.frame_ms is None else f"frame_ms = {args.frame_ms}\n"
        study = write_study(d, STUDY.format(ttft=args.ttft_ms, tps=args.tps, frame=frame,
                                            upstream=upstream) + proxy_toml(args))
        max_tokens = args.answer_tokens or 400
        db = d / "bench.db"
        keys = enroll_keys(study, db, 10)
        results = []
        with proxy_process(study, db, env) as url:
            place_proxy(args, url.pid)
            asyncio.run(load(url, keys, 5, 1))  # warm-up: imports, connections, caches
            witness = witness_for(args)
            shield = stack.enter_context(shielded_cpu(args))
            steal, delay = CpuSteal(), RunDelay(url.pid)
            cpu0, t0 = cpu_seconds(url.pid), time.monotonic()
            for _ in range(args.rounds):
                results += asyncio.run(load(url, keys, args.streams, args.stagger_ms,
                                            max_tokens))
            steal_pct, waited = steal.pct(), delay.summary()
            if witness is not None:
                witness.finish()
            noise = timer_noise(2.0, args.priority, proxy_cpu(args))
            cpu = cpu_seconds(url.pid) - cpu0
            wall = time.monotonic() - t0
        ids = [r[0] for r in results]
        con = sqlite3.connect(db)
        marks = ",".join("?" * len(ids))
        q = ("SELECT id, experienced_ttft_ms, target_ttft_ms, achieved_tps, target_tps, "
             "tokens_sent, violation, violation_ms, status, t_request_ns, t_first_sent_ns, "
             "t_upstream_first_ns "
             f"FROM cycles WHERE id IN ({marks})")
        rows = {r[0]: r for r in con.execute(q, ids)}
        errors = [r[0] for r in con.execute(f"SELECT error FROM cycles WHERE id IN ({marks})",
                                            ids)]
        con.close()
    ttft_err = [abs(r[1] - r[2]) for r in rows.values() if r[1] is not None]
    client_err = [abs(r[1] - args.ttft_ms) for r in results if r[1] is not None]
    long = [r for r in rows.values() if r[5] and r[5] >= args.min_tokens and r[3]]
    tps_err = [abs(r[3] - r[4]) / r[4] * 100 for r in long]
    out = {
        "streams_concurrent": args.streams,
        "rounds": args.rounds,
        "target_ttft_ms": args.ttft_ms,
        "target_tps": args.tps,
        "upstream": args.upstream,
        "upstream_tps": args.upstream_tps,
        "cycles": len(rows),
        "completed_with_DONE": sum(1 for r in results if r[2]),
        "ttft_abs_err_ms_proxy": {"p50": percentile(ttft_err, 50), "p99": percentile(ttft_err, 99),
                                  "max": max(ttft_err)},
        "ttft_abs_err_ms_client": {"p50": percentile(client_err, 50),
                                   "p99": percentile(client_err, 99)},
        "min_tokens": args.min_tokens,
        "frame_ms": args.frame_ms,
        "tps_err_pct_streams_ge_100_tokens": {
            "n": len(tps_err), "p50": percentile(tps_err, 50), "p99": percentile(tps_err, 99),
            "max": max(tps_err) if tps_err else None},
        "violations": sum(1 for r in rows.values() if r[6]),
        # The proxy can only hold tokens back: a first byte from the upstream after the
        # target release is a TTFT miss the upstream caused (its model, or its machine).
        "upstream_first_byte_after_target": sum(
            1 for r in rows.values()
            if r[11] is not None and r[11] > r[9] + int(r[2] * 1e6)),
        "proxy_cpu_s": round(cpu, 2),
        "proxy_cpu_share": round(cpu / wall, 3),
        "proxy_cpu_us_per_token": round(cpu / max(1, sum(r[5] or 0 for r in rows.values()))
                                        * 1e6, 1),
        "statuses": dict(Counter(r[8] for r in rows.values())),
        "errors": dict(Counter(e for e in errors if e)),
        "proxy_nice": args.priority,
        "proxy_pinned_cpu": proxy_cpu(args),
        "proxy_cpu_stalls_witnessed": witness.summary() if witness else None,
        "misses_vs_cpu_stalls": attribute_misses(witness, [
            (r[9] + int(r[2] * 1e6), r[10], r[1] - r[2]) for r in rows.values()
            if r[1] is not None and r[10] is not None], 2.0) if witness else None,
        "cpu_steal_pct": steal_pct,
        "proxy_threads_waiting_for_cpu": waited,
        "proxy_cpu_shielded": shield or None,
        "bare_asyncio_sleep_lateness_ms_same_machine": noise,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
