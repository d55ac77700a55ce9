"""Fast arms (issue 21): 50 vs 1,000 vs 3,000 tokens/s through the proxy, in one run.

Runs ``bench_proxy_shaping.py`` once per (tokens/s, model placement) — the built-in model
inside the proxy (``inprocess``) and as a separate HTTP server (``http``) — with
``--streams`` concurrent streams of ``--answer-tokens`` tokens each (the simulated model's
``answer_tokens`` setting; the 50 tokens/s row uses ``--slow-tokens`` so it stays short),
and prints one compact table so the ratios compare: tokens/s error of streams of at least
300 tokens (p50 / p99 / max), the proxy's |TTFT error| (p50 / p99), violations, proxy CPU µs
per token, and the machine's floor measured right after each row (lateness of a bare
``asyncio.sleep``, p50 / p99). ``--frame-ms`` sets the arms' ``frame_ms`` (0: one write per
token; several values give one row each). ``--json`` prints every run's full figures too.

    python benchmarks/bench_proxy_fast.py [--tps 50 1000 3000] [--upstream inprocess http]
                                          [--frame-ms 0 8] [--streams 50] [--pin]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPING = ROOT / "benchmarks" / "bench_proxy_shaping.py"


def run(tps: float, upstream: str, frame_ms: float | None, tokens: int, args: Any
        ) -> dict[str, Any]:
    """One shaping run; its JSON figures."""
    argv = [sys.executable, str(SHAPING), "--tps", str(tps), "--upstream", upstream,
            "--streams", str(args.streams), "--rounds", str(args.rounds),
            "--ttft-ms", str(args.ttft_ms), "--answer-tokens", str(tokens),
            "--min-tokens", str(min(300, tokens)), "--stagger-ms", str(args.stagger_ms)]
    if frame_ms is not None:
        argv += ["--frame-ms", str(frame_ms)]
    if args.pin:
        argv.append("--pin")
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"bench_proxy_shaping failed ({tps} tok/s, {upstream}):\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def row(tps: float, upstream: str, frame_ms: float | None, r: dict[str, Any]) -> str:
    e, t = r["tps_err_pct_streams_ge_100_tokens"], r["ttft_abs_err_ms_proxy"]
    floor = r["bare_asyncio_sleep_lateness_ms_same_machine"]
    frame = "-" if frame_ms is None else f"{frame_ms:g}"
    return (f"{tps:>6g} {upstream:>9} {frame:>5} {r['cycles']:>4} {e['n']:>4} "
            f"{e['p50']:>6.2f} {e['p99']:>6.2f} {e['max'] or 0:>6.2f}  "
            f"{t['p50']:>5.2f} {t['p99']:>6.2f} {r['violations']:>4} "
            f"{r['upstream_first_byte_after_target']:>4} "
            f"{r['proxy_cpu_us_per_token']:>7.1f} {r['proxy_cpu_share']:>5.2f}  "
            f"{floor['p50']:>5.2f} {floor['p99']:>5.2f} {r['load_avg_1m']:>5.2f}")


HEADER = (f"{'tok/s':>6} {'model':>9} {'frame':>5} {'cyc':>4} {'n':>4} "
          f"{'err%50':>6} {'err%99':>6} {'errmax':>6}  {'ttft50':>5} {'ttft99':>6} "
          f"{'viol':>4} {'upL':>4} {'cpu_us':>7} {'cpu':>5}  {'fl50':>5} {'fl99':>5} {'load':>5}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tps", type=float, nargs="+", default=[50.0, 1000.0, 3000.0])
    ap.add_argument("--upstream", nargs="+", choices=["inprocess", "http"],
                    default=["inprocess", "http"])
    ap.add_argument("--frame-ms", type=float, nargs="+", default=None,
                    help="the arms' frame_ms values to compare (0: one write per token; "
                         "default: the arm's default)")
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttft-ms", type=float, default=300.0)
    ap.add_argument("--stagger-ms", type=float, default=5.0)
    ap.add_argument("--answer-tokens", type=int, default=2000,
                    help="tokens per answer on the fast rows (>= 300)")
    ap.add_argument("--slow-tokens", type=int, default=300,
                    help="tokens per answer on rows of 100 tokens/s or less (bounded runtime)")
    ap.add_argument("--pin", action="store_true", help="passed on (see bench_proxy_shaping)")
    ap.add_argument("--json", action="store_true", help="also print every run's figures")
    args = ap.parse_args()
    t0 = time.monotonic()
    lines, full = [], []
    print("rate error: |achieved − target| / target of streams ≥ 300 tokens (%); ttft: "
          "proxy |TTFT error| (ms); viol: manipulation violations; upL: streams whose "
          "upstream's first byte came after the target release (its miss); cpu_us: proxy "
          "CPU µs per token; cpu: proxy CPU share; "
          "fl50/fl99: bare asyncio.sleep lateness on this machine (ms), the floor",
          file=sys.stderr)
    print(HEADER, file=sys.stderr, flush=True)
    for upstream in args.upstream:
        for tps in args.tps:
            tokens = args.slow_tokens if tps <= 100 else args.answer_tokens
            for frame in args.frame_ms or [None]:
                r = run(tps, upstream, frame, tokens, args)
                lines.append(row(tps, upstream, frame, r))
                full.append({"tps": tps, "upstream": upstream, "frame_ms": frame, **r})
                print(lines[-1], file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(full, indent=2))
    print(HEADER)
    print("\n".join(lines))
    print(f"({time.monotonic() - t0:.0f} s, {args.streams} streams × {args.rounds} rounds, "
          f"{args.answer_tokens} tokens per fast answer)")


if __name__ == "__main__":
    main()
