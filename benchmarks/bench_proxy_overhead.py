"""Added time-to-first-token of the proxy, shaping off.

The simulated model is served over loopback HTTP (as ``flowtrial mock-model``, TTFT 0); the
proxy runs in its own process with ``upstream.kind = "openai"`` pointing at it and one
unshaped arm. A client in this process sends the same streaming chat request directly to the
model and through the proxy, one request at a time, in randomized pairs, and measures the
time from sending the request to receiving the first content token.

Reported: median and p99 of (through proxy − direct) per pair. Targets: ≤ 1 ms median,
≤ 3 ms p99. In the same interleaved run the request also goes through a bare byte-for-byte
TCP relay (uvloop, no HTTP parsing, its own process): what that adds is the floor under any
user-space proxy hop on this machine, and ``proxy_minus_relay`` is what flowtrial's own
work costs on top of it.

    python benchmarks/bench_proxy_overhead.py [--pairs 400]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_proxy_common import (  # noqa: E402
    _env,
    enroll_keys,
    mock_model_process,
    percentile,
    proxy_process,
    tcp_relay_process,
    write_study,
)

STUDY = """
[study]
name = "bench-overhead"
design = "parallel"
[upstream]
kind = "openai"
base_url = "{base}"
api_key_env = "FLOWTRIAL_BENCH_UPSTREAM_KEY"
[[arms]]
name = "team"
[capture]
content = "fingerprint"
"""


def ttft_ms(http: httpx.Client, url: str, key: str, i: int) -> float:
    body = {"model": "flowtrial-sim-1", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": f"reverse a list in python {i % 7}"}]}
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", url + "/chat/completions", json=body,
                     headers={"authorization": f"Bearer {key}"}) as r:
        for line in r.iter_lines():  # read to the end so the connection is reused
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = (time.perf_counter() - t0) * 1000
    if first is None:
        raise RuntimeError("no content in the answer")
    return first


def breakdown(db: Path) -> dict[str, float]:
    import sqlite3
    import statistics

    con = sqlite3.connect(db)
    rows = con.execute("SELECT t_upstream_first_ns - t_request_ns, "
                       "t_first_sent_ns - t_upstream_first_ns FROM cycles "
                       "WHERE t_upstream_first_ns IS NOT NULL").fetchall()
    con.close()
    return {"request_to_upstream_first_p50": statistics.median(r[0] for r in rows) / 1e6,
            "upstream_first_to_client_p50": statistics.median(r[1] for r in rows) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--priority", type=int, default=0,
                    help="nice value for the proxy and model processes (e.g. -10, needs root)")
    args = ap.parse_args()
    env = _env() | {"FLOWTRIAL_BENCH_UPSTREAM_KEY": "sk-bench-not-a-real-key"}
    with tempfile.TemporaryDirectory() as tmp, mock_model_process(0.0, 20000.0) as mock:
        d = Path(tmp)
        study = write_study(d, STUDY.format(base=mock))
        db = d / "bench.db"
        key = enroll_keys(study, db, 1)[0]
        with proxy_process(study, db, env) as proxy, tcp_relay_process(mock) as relay, \
                httpx.Client(timeout=30) as http:
            if args.priority:
                for pid in (proxy.pid, mock.pid, relay.pid, os.getpid()):
                    os.setpriority(os.PRIO_PROCESS, pid, args.priority)
            targets = {"direct": (mock, "sk-any"), "proxy": (proxy + "/v1", key),
                       "relay": (relay, "sk-any")}
            for i in range(30):  # warm-up: connections, caches, first-request paths
                for name in targets:
                    ttft_ms(http, *targets[name], i)
            rng = random.Random(1)
            pairs = []
            for i in range(args.pairs):
                order = list(targets)
                rng.shuffle(order)
                got = {name: ttft_ms(http, *targets[name], i) for name in order}
                pairs.append(got)
        inside = breakdown(db)
    diffs = [p["proxy"] - p["direct"] for p in pairs]
    floor = [p["relay"] - p["direct"] for p in pairs]
    own = [p["proxy"] - p["relay"] for p in pairs]
    direct = [p["direct"] for p in pairs]
    via = [p["proxy"] for p in pairs]
    print(json.dumps({
        "pairs": len(pairs),
        "direct_ttft_ms": {"p50": percentile(direct, 50), "p99": percentile(direct, 99)},
        "proxy_ttft_ms": {"p50": percentile(via, 50), "p99": percentile(via, 99)},
        "added_ttft_ms": {"p50": percentile(diffs, 50), "p90": percentile(diffs, 90),
                          "p99": percentile(diffs, 99)},
        "targets": {"p50": 1.0, "p99": 3.0},
        # The same request through a bare TCP relay: the cost of any extra hop here.
        "relay_added_ttft_ms": {"p50": percentile(floor, 50), "p90": percentile(floor, 90),
                                "p99": percentile(floor, 99)},
        "proxy_minus_relay_ms": {"p50": percentile(own, 50), "p99": percentile(own, 99)},
        # Where the proxy's own time goes (medians, from its cycle rows): request received →
        # upstream's first byte, and first upstream byte → first byte written to the client.
        # The rest of the added time is outside the app: the extra loopback hop and uvicorn.
        "inside_proxy_ms": inside,
        "nice": args.priority,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }, indent=2))


if __name__ == "__main__":
    main()
