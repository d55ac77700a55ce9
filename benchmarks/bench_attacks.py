"""Issue #28's attacks against a proxy process while a well-behaved participant (p02, a
100 ms TTFT arm) streams chats: p02's TTFT (p50, p99, max) quiet and under each attack,
failures, unrecorded answers, what the attacker stored, and the machine's floor (lateness of
a bare ``asyncio.sleep`` now). Each attack runs ``--seconds`` (≤ 30), loopback only, at most
1,100 connections; the harness is ``tests/security/attack_harness.py``.

    python benchmarks/bench_attacks.py [--seconds 8] [--only events_9.8MB,...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_proxy_common import timer_noise  # noqa: E402

from tests.security.attack_harness import ATTACKS, TTFT_FLOOR_MS, arena, measure  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--only", default="", help="comma-separated attack names")
    args = ap.parse_args()
    if not 2 <= args.seconds <= 30:
        ap.error("--seconds: between 2 and 30 (each attack is bounded)")
    wanted = {n for n in args.only.split(",") if n}
    floor = timer_noise(2.0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; machine floor "
          f"(asyncio.sleep lateness): {floor}")
    print(f"arm TTFT floor {TTFT_FLOOR_MS:.0f} ms; target p99 <= {TTFT_FLOOR_MS + 250:.0f} ms")
    print("TTFT at p02's client (p50/p99/max ms); upstream = the shared simulated model's own "
          "first token (p99); late = the proxy's release after max(floor, upstream) (p99)")
    print(f"{'attack':<22}{'n':>4}{'p50':>7}{'p99':>7}{'max':>7}{'upstr':>7}{'late':>7}"
          f"{'fail':>6}{'unrec':>6}{'rows':>7}{'bytes':>10}  attacker saw")
    with tempfile.TemporaryDirectory() as d, arena(Path(d)) as a:
        for attack in [None, *ATTACKS]:
            if attack is not None and wanted and attack.name not in wanted:
                continue
            t0 = time.monotonic()
            o = measure(a, attack, args.seconds)
            top = max(o.ttft_ms) if o.ttft_ms else float("nan")
            print(f"{o.name:<22}{len(o.ttft_ms):>4}{o.p(50):>7.0f}{o.p(99):>7.0f}{top:>7.0f}"
                  f"{o.p(99, 'upstream_ms'):>7.0f}{o.p(99, 'proxy_late_ms'):>7.0f}"
                  f"{len(o.failed):>6}{o.unrecorded:>6}{o.stored_rows:>7}{o.stored_bytes:>10}"
                  f"  {o.attack} ({time.monotonic() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
