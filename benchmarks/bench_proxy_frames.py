"""Display-frame delivery vs one write per token, in one run (issue 21).

Runs ``bench_proxy_shaping.py`` (its options pass through) once per ``--frames`` value —
``0`` is the per-token path — alternating them ``--repeat`` times so the machine's load
falls on all alike, and prints each run's figures and a summary: tokens/s error (p50 / p99 /
max), proxy TTFT error, CPU µs per token, and the bare ``asyncio.sleep`` lateness floor.

    python benchmarks/bench_proxy_frames.py --frames 0 8 --streams 50 --tps 1000 \\
        --ttft-ms 300 --pin
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_proxy_shaping as shaping  # noqa: E402

_TEMPLATE = shaping.STUDY


def run(frame_ms: float, argv: list[str]) -> dict[str, Any]:
    """One run of the shaping benchmark with the arm's ``frame_ms``."""
    shaping.STUDY = _TEMPLATE.replace("tokens_per_second = {tps}\n",
                                      f"tokens_per_second = {{tps}}\nframe_ms = {frame_ms}\n")
    assert shaping.STUDY != _TEMPLATE, "bench_proxy_shaping's study template changed"
    out = io.StringIO()
    old = sys.argv
    sys.argv = ["bench_proxy_shaping.py", *argv]
    try:
        with contextlib.redirect_stdout(out):
            shaping.main()
    finally:
        sys.argv = old
        shaping.STUDY = _TEMPLATE
    return json.loads(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=float, nargs="+", default=[0.0, 8.0],
                    help="frame_ms values to compare (0 = one write per token)")
    ap.add_argument("--repeat", type=int, default=1, help="alternations of the values")
    args, rest = ap.parse_known_args()
    summary = []
    for _ in range(args.repeat):
        for f in args.frames:
            r = run(f, rest)
            tps = r["tps_err_pct_streams_ge_100_tokens"]
            summary.append({
                "frame_ms": f, "tps_err_pct": {k: tps[k] for k in ("n", "p50", "p99", "max")},
                "ttft_err_ms_proxy": r["ttft_abs_err_ms_proxy"],
                "cpu_us_per_token": r["proxy_cpu_us_per_token"],
                "violations": r["violations"], "cycles": r["cycles"],
                "statuses": r["statuses"],
                "floor_sleep_lateness_ms": r["bare_asyncio_sleep_lateness_ms_same_machine"],
                "load_avg_1m": r["load_avg_1m"],
            })
            print(json.dumps(summary[-1]), file=sys.stderr, flush=True)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
