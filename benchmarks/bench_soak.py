"""Soak: many simulated participants working through one proxy for minutes.

One ``flowtrial proxy`` process (the CLI's own code path, ``python -m
instrumentation.proxy``) with the built-in simulated model as its upstream and per-prompt
shaping (each prompt draws its TTFT and tokens/s, by default 300–1000 ms and 50–200
tokens/s). ``--participants`` enrolled participants each loop: send a prompt, read the stream
to its end, think, again — for ``--seconds``; then every stream still open is read to its end
and the proxy is stopped with SIGTERM. By default they think as the simulator's participants
do (``flowtrial.study.simulator.params.SimParams``: review the answer, median 15 s, then craft the
next prompt, median 20 s; log-normal), so 200 of them are the load of 200 developers.
``--think-s S`` instead draws think times with mean S s (exponential): ``--think-s 1`` is a
stress test, tens of times a real team's load. The clients are light raw-socket
asyncio loops in this process, so hundreds of them do not load the machine being measured.

Printed (JSON):

- ``client_complete`` (streams whose ``[DONE]`` a client read) against ``recorded`` (their
  cycle rows) and the difference both ways: nothing a client saw complete may be missing;
- the proxy's resident memory sampled every second: mean of the first 30 s against the last
  30 s (the first and last third for runs under 90 s): memory must stay flat;
- shaping precision from the cycle rows: |experienced TTFT − target| p50 / p99 / max (ms),
  |achieved tokens/s − target| / target p50 / p99 (streams of at least 20 tokens), the
  number of manipulation violations; the client-side TTFT error for comparison;
- errors (statuses, error texts, client failures), cycles per second, the proxy's CPU share,
  the machine's load and a bare-``asyncio.sleep`` lateness probe (the floor under any
  event-loop timing on this machine).

    python benchmarks/bench_soak.py [--seconds 120] [--participants 200] [--think-s 1.0]
                                    [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_proxy_common import (  # noqa: E402
    CpuSteal,
    RunDelay,
    add_placement_options,
    attribute_misses,
    cpu_seconds,
    enroll_keys,
    percentile,
    pin_load_generator,
    place_proxy,
    proxy_cpu,
    proxy_process,
    shielded_cpu,
    timer_noise,
    witness_for,
    write_study,
)

STUDY = """
[study]
name = "bench-soak"
design = "per_prompt"
seed = 7

[upstream]
kind = "mock"
[upstream.mock]
tokens_per_second = 3000
ttft_ms = 20

[per_prompt]
ttft_ms = {{ min = {ttft_min}, max = {ttft_max} }}
tokens_per_second = {{ min = {tps_min}, max = {tps_max} }}

[capture]
content = "fingerprint"
"""
CYCLE = re.compile(rb"x-flowtrial-cycle-id: (\S+)\r\n")
CONTENT = re.compile(rb'"content":"[^"]')
PROMPTS = [
    "write a python function that merges two sorted lists",
    "explain what this regex does: ^(\\d{3})-(\\d{4})$",
    "add type hints to a small flask view",
    "why does my asyncio gather hang with 5000 urls",
    "refactor a class into dataclasses",
    "write a pytest fixture for a temporary sqlite database",
]


class Tally:
    """What the simulated participants saw."""

    def __init__(self) -> None:
        self.complete: set[str] = set()
        self.incomplete: list[str] = []
        self.failures: Counter[str] = Counter()
        self.client_ttft_ms: dict[str, float] = {}
        self.sent = 0


async def one_prompt(host: str, port: int, key: str, prompt: str, max_tokens: int,
                     tally: Tally) -> None:
    body = json.dumps({"model": "flowtrial-sim-1", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    tally.sent += 1
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        tally.failures[f"connect: {type(exc).__name__}"] += 1
        return
    buf = b""
    first = None
    try:
        writer.write(head + body)
        while data := await reader.read(65536):
            if first is None and CONTENT.search(data):
                first = (time.monotonic() - t0) * 1000
            buf += data
    except OSError as exc:
        tally.failures[f"read: {type(exc).__name__}"] += 1
    finally:
        writer.close()
    m = CYCLE.search(buf)
    if m is None:
        status = buf.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        tally.failures[f"no cycle id: {status[:60]}"] += 1
        return
    cid = m.group(1).decode()
    if b"data: [DONE]" in buf:
        tally.complete.add(cid)
        if first is not None:
            tally.client_ttft_ms[cid] = first
    else:
        tally.incomplete.append(cid)


class Thinking:
    """Think times between an answer's end and the next prompt: the simulator's human
    durations (``think_s`` None) or exponential with mean ``think_s``."""

    def __init__(self, think_s: float | None) -> None:
        from flowtrial.study.simulator.params import SimParams

        self.think_s = think_s
        p = SimParams()
        self.parts = [(p.review_verify.median, p.review_verify.logsd),
                      (p.prompt_crafting.median, p.prompt_crafting.logsd)]

    def first(self, rng: random.Random) -> float:
        """A start offset, so participants are spread over one think time (steady state)."""
        if self.think_s is None:
            return rng.uniform(0, sum(m for m, _ in self.parts))
        return rng.uniform(0, min(5.0, self.think_s * 3))

    def draw(self, rng: random.Random) -> float:
        if self.think_s is None:
            return sum(rng.lognormvariate(math.log(m), sd) for m, sd in self.parts)
        return rng.expovariate(1 / self.think_s) if self.think_s > 0 else 0.0


async def participant(host: str, port: int, key: str, rng: random.Random, until: float,
                      thinking: Thinking, max_tokens: int, tally: Tally) -> None:
    await asyncio.sleep(thinking.first(rng))  # do not all start at once
    while time.monotonic() < until:
        await one_prompt(host, port, key, rng.choice(PROMPTS), max_tokens, tally)
        # A think that would outlast the run ends with it (the loop then stops).
        await asyncio.sleep(min(thinking.draw(rng), max(0.0, until - time.monotonic())))


def _tree(pid: int) -> list[int]:
    """The proxy and its worker processes (``--workers``)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    return [pid, *map(int, kids)]


def rss_mb(pid: int) -> float:
    """Resident memory of the proxy, its workers included."""
    total = 0.0
    for p in _tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def tree_cpu(pid: int) -> dict[int, float]:
    return {p: cpu_seconds(p) for p in _tree(pid)}


def sample_rss(pid: int, every_s: float, out: list[tuple[float, float]],
               stop: threading.Event) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            out.append((time.monotonic() - t0, rss_mb(pid)))
        except OSError:
            return
        stop.wait(every_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--participants", type=int, default=200)
    ap.add_argument("--think-s", type=float, default=None,
                    help="mean think time (s, exponential) between a stream's end and the "
                         "next prompt; default: the simulator's participants (review + "
                         "crafting the next prompt, medians 15 s + 20 s)")
    ap.add_argument("--max-tokens", type=int, default=150)
    ap.add_argument("--ttft-ms", type=float, nargs=2, default=(300.0, 1000.0),
                    metavar=("MIN", "MAX"))
    ap.add_argument("--tps", type=float, nargs=2, default=(50.0, 200.0),
                    metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="the proxy's worker processes (flowtrial proxy --workers)")
    add_placement_options(ap)
    args = ap.parse_args()
    if args.pin and args.workers > 1:
        raise SystemExit("--pin puts one proxy process on one CPU: use --workers 1")
    pin_load_generator(args)

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        study = write_study(d, STUDY.format(ttft_min=args.ttft_ms[0], ttft_max=args.ttft_ms[1],
                                            tps_min=args.tps[0], tps_max=args.tps[1]))
        db = d / "soak.db"
        t_enroll = time.monotonic()
        keys = enroll_keys(study, db, args.participants)
        enroll_s = time.monotonic() - t_enroll
        tally = Tally()
        rss: list[tuple[float, float]] = []
        stop = threading.Event()
        # The shield leaves the proxy alone: it still has this process's CPUs when it starts.
        with proxy_process(study, db, None, "--workers", str(args.workers)) as url, \
                shielded_cpu(args) as shield:
            place_proxy(args, url.pid)
            witness = witness_for(args)
            host, port = url.split("//", 1)[1].rsplit(":", 1)
            sampler = threading.Thread(target=sample_rss, args=(url.pid, 1.0, rss, stop),
                                       daemon=True)
            sampler.start()
            steal, delay = CpuSteal(), RunDelay(url.pid)
            cpu0, t0 = tree_cpu(url.pid), time.monotonic()
            rng = random.Random(args.seed)
            thinking = Thinking(args.think_s)

            async def run() -> None:
                until = time.monotonic() + args.seconds
                await asyncio.gather(*(
                    participant(host, int(port), k, random.Random(rng.random()), until,
                                thinking, args.max_tokens, tally) for k in keys))

            asyncio.run(run())  # returns once every participant's last stream has ended
            wall = time.monotonic() - t0
            cpu_by = {p: c - cpu0.get(p, 0.0) for p, c in tree_cpu(url.pid).items()}
            cpu = sum(cpu_by.values())
            steal_pct, waited = steal.pct(), delay.summary()
            stop.set()
            sampler.join(5)
            if witness is not None:
                witness.finish()
            noise = timer_noise(2.0, args.priority, proxy_cpu(args))
        # SIGTERM has drained the writer: the database is complete now.
        con = sqlite3.connect(db)
        rows = con.execute(
            "SELECT id, status, error, experienced_ttft_ms, target_ttft_ms, achieved_tps, "
            "target_tps, tokens_sent, violation, t_done_ns - t_request_ns, t_request_ns, "
            "t_first_sent_ns FROM cycles"
        ).fetchall()
        con.close()

    by_id = {r[0]: r for r in rows}
    recorded = set(by_id)
    ttft_err = [abs(r[3] - r[4]) for r in rows if r[3] is not None and r[4] is not None]
    tps_err = [abs(r[5] - r[6]) / r[6] * 100 for r in rows
               if r[5] and r[6] and r[7] and r[7] >= 20]
    client_err = [abs(ms - by_id[c][4]) for c, ms in tally.client_ttft_ms.items()
                  if c in by_id and by_id[c][4] is not None]
    window = min(30.0, args.seconds / 3)
    end = rss[-1][0] if rss else 0.0
    first = [mb for t, mb in rss if t <= window]
    last = [mb for t, mb in rss if t >= end - window]
    out = {
        "participants": args.participants,
        "seconds": args.seconds,
        "think": ("simulator (review + next prompt)" if args.think_s is None
                  else f"exponential, mean {args.think_s} s"),
        "target_ranges": {"ttft_ms": list(args.ttft_ms), "tokens_per_second": list(args.tps)},
        "enroll_s": round(enroll_s, 1),
        "requests_sent": tally.sent,
        "client_complete": len(tally.complete),
        "recorded": len(recorded),
        "client_complete_not_recorded": len(tally.complete - recorded),
        "recorded_not_client_complete": len(recorded - tally.complete),
        "client_incomplete_streams": len(tally.incomplete),
        "client_failures": dict(tally.failures),
        "cycles_per_s": round(len(recorded) / wall, 1),
        # Streams open at once, on average (sum of cycle durations over the run's length).
        "concurrent_streams_mean": round(sum(r[9] or 0 for r in rows) / 1e9 / wall, 1),
        "rss_mb": {
            "window_s": window,
            "first_window_mean": round(mean(first), 1) if first else None,
            "last_window_mean": round(mean(last), 1) if last else None,
            "growth_pct": (round((mean(last) / mean(first) - 1) * 100, 1)
                           if first and last else None),
            "max": round(max(mb for _, mb in rss), 1) if rss else None,
            "samples": len(rss),
        },
        "ttft_abs_err_ms": {"p50": percentile(ttft_err, 50), "p99": percentile(ttft_err, 99),
                            "max": max(ttft_err) if ttft_err else None, "n": len(ttft_err)},
        "ttft_abs_err_ms_client": {"p50": percentile(client_err, 50),
                                   "p99": percentile(client_err, 99)},
        "tps_err_pct_streams_ge_20_tokens": {"p50": percentile(tps_err, 50),
                                             "p99": percentile(tps_err, 99),
                                             "n": len(tps_err)},
        "violations": sum(1 for r in rows if r[8]),
        "statuses": dict(Counter(r[1] for r in rows)),
        "errors": dict(Counter(r[2] for r in rows if r[2])),
        "proxy_workers": args.workers,
        # Of one core, summed over the proxy's processes; and the busiest single process.
        "proxy_cpu_share": round(cpu / wall, 3),
        "proxy_cpu_share_busiest_process": round(max(cpu_by.values()) / wall, 3),
        "wall_s": round(wall, 1),
        "cpu_steal_pct": steal_pct,
        "proxy_threads_waiting_for_cpu": waited,
        "proxy_pinned_cpu": proxy_cpu(args),
        "proxy_cpu_shielded": shield or None,
        "proxy_cpu_stalls_witnessed": witness.summary() if witness else None,
        "misses_vs_cpu_stalls": attribute_misses(witness, [
            (r[10] + int(r[4] * 1e6), r[11], r[3] - r[4]) for r in rows
            if r[3] is not None and r[4] is not None and r[11] is not None], 2.0)
        if witness else None,
        "bare_asyncio_sleep_lateness_ms_same_machine": noise,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=2))
    ok = (out["client_complete"] == out["recorded"] and not out["client_complete_not_recorded"])
    if not ok:
        print("FAIL: client-complete and recorded counts differ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
