"""Recording throughput: completed cycles per second made durable through the RecordWriter,
and what recording at that rate does to token delivery on the same event loop.

Each simulated completion builds its cycle row the way the proxy does (fingerprints of a
~300-token answer and its prompt), submits it to the proxy's writer (one thread, pooled
SQLite connection, WAL, synchronous=FULL, group commit) and awaits durability, with up to
``--in-flight`` completions waiting at once (concurrent streams ending). Meanwhile a probe
coroutine sleeps to 2 ms deadlines, as the shaper does between tokens, and records how late
it wakes: its lateness with and without the recording load shows whether recording slows
delivery.

Target: ≥ 2,000 cycles/s.

    python benchmarks/bench_recording.py [--cycles 20000] [--in-flight 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_proxy_common import percentile  # noqa: E402
from flowtrial.instrumentation.proxy.recorder import CycleRecord, Recorder  # noqa: E402
from flowtrial.instrumentation.proxy.shaping import Target  # noqa: E402
from flowtrial.instrumentation.proxy.state import close_writer, make_writer  # noqa: E402
from flowtrial.study.config import parse_study  # noqa: E402
from flowtrial.study.participants import enroll  # noqa: E402
from flowtrial.study.storage import init_db  # noqa: E402

ANSWER = ("def reverse(items):\n"
          "    \"\"\"Return a new list with the items in reverse order.\"\"\"\n"
          "    return items[::-1]\n\n") * 12
PROMPT = "write a python function that reverses a list without modifying it"


def make_record(i: int, pid: str) -> CycleRecord:
    now = time.monotonic_ns()
    rec = CycleRecord(
        id=f"cyc_bench_{i:08d}", participant_id=pid, protocol="chat", stream=True,
        model="flowtrial-sim-1", upstream="mock", mono_anchor_ns=now, wall_anchor_ns=now,
        t_request_ns=now - 900_000_000, started_at=datetime.now(UTC), prompt_text=PROMPT,
        arm="shaped", target=Target(400.0, 50.0),
    )
    rec.t_upstream_first_ns = now - 880_000_000
    rec.sent(now - 500_000_000, now - 500_100_000, None)
    rec.sent(now, None, now - 100_000)
    rec.tokens_sent = 300
    rec.usage = {"prompt_tokens": 20, "completion_tokens": 300}
    rec.content_parts = [ANSWER]
    return rec


async def probe(stop: asyncio.Event, out: list[float]) -> None:
    """Sleep to 2 ms deadlines like the shaper; collect lateness (ms)."""
    while not stop.is_set():
        due = time.monotonic_ns() + 2_000_000
        await asyncio.sleep(0.002)
        out.append((time.monotonic_ns() - due) / 1e6)


async def run(recorder: Recorder, pids: list[str], n: int, in_flight: int) -> tuple[float, dict]:
    lat_idle: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(probe(stop, lat_idle))
    await asyncio.sleep(1.0)
    stop.set()
    await task

    lat_busy: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(probe(stop, lat_busy))
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await recorder.record(make_record(i, pids[i % len(pids)]))

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[one(i) for i in range(n)])
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stop.set()
    await task
    return n / elapsed, {
        "cpu_us_per_cycle_all_threads": round(cpu / n * 1e6),
        "cycles_per_cpu_second": round(n / cpu),
        "probe_lateness_ms_idle": {"p50": percentile(lat_idle, 50),
                                   "p99": percentile(lat_idle, 99)},
        "probe_lateness_ms_while_recording": {"p50": percentile(lat_busy, 50),
                                              "p99": percentile(lat_busy, 99)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=200)
    args = ap.parse_args()
    config = parse_study({"study": {"name": "bench-recording", "design": "parallel"},
                          "arms": [{"name": "shaped", "ttft_ms": 400, "tokens_per_second": 50}]})
    with tempfile.TemporaryDirectory() as tmp:
        database = init_db(Path(tmp) / "bench.db", config)
        pids = [enroll(database, config, f"p{i:02d}")[0].id for i in range(20)]
        writer = make_writer(database)
        recorder = Recorder(writer, os.environ.get("BENCH_CAPTURE", "fingerprint"))
        sys.setswitchinterval(0.001)  # as the proxy runs
        try:
            rate, probe_stats = asyncio.run(run(recorder, pids, args.cycles, args.in_flight))
        finally:
            close_writer(writer)
        rows = database.engine.connect().exec_driver_sql("SELECT count(*) FROM cycles").scalar()
        commits = writer.commits
        database.dispose()
    print(json.dumps({
        "cycles": args.cycles,
        "rows_in_database": rows,
        "in_flight": args.in_flight,
        "cycles_per_s": round(rate),
        "commits": commits,
        "rows_per_commit": round(args.cycles / max(1, commits), 1),
        **probe_stats,
        "target_cycles_per_s": 2000,
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }, indent=2))


if __name__ == "__main__":
    main()
