"""Where does the threshold test's bootstrap null go wrong? (issue 27, the four-arm miss)

`bench_outside_truths.py` found the test liberal for one outside truth and design: a
logistic in the wait in seconds, people's slopes log-normal, waits from four latency arms.
Two diagnostics tell a generator that differs from the test's alternative apart from a
bootstrap null that is too narrow at the fitted parameters:

* ``--mode own``: the same truth and waits, but the switches drawn by the test's own
  alternative (`threshold_test.simulate_alternative`, the straight rise in seconds whose size
  people scale log-normally) at the truth's parameters, then run through `flowtrial threshold
  --json` as the outside studies are. If this is liberal too, the family is the test's own
  and the fault is the parametric bootstrap at θ̂, not the outside generator.
* ``--mode sensitivity``: for one outside study (``--study SEED``), the in-test null T* at
  the fitted alternative and with each of its parameters scaled (σ_u, τ by 0.6 and 1.4, δ by
  0.8 and 1.25), on the same replicate seeds: how far the null moves with θ (a null that
  moves much is not pivotal, and a bootstrap at θ̂ carries θ̂'s error into the test's size).

Usage: python benchmarks/bench_bootstrap_null.py --mode own [--seeds 24] [--first-seed 100]
       [--workers 2] [--jsonl FILE] [--fixed-seed]
       python benchmarks/bench_bootstrap_null.py --mode sensitivity --study 150 [--n 39]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outside_truths import cli_command, outside_study  # noqa: E402  (a sibling)
from threshold_families import wilson  # noqa: E402

from flowtrial.analysis.personal_threshold import _data  # noqa: E402
from flowtrial.analysis.rb_model import CycleData  # noqa: E402
from flowtrial.analysis.threshold_test import (  # noqa: E402
    LINEAR_SECONDS,
    _replicate,
    simulate_alternative,
)
from flowtrial.analysis.workers import run_jobs  # noqa: E402

TRUTH, DESIGN = "logit_lin", "arms"


def truth_theta(data: CycleData) -> np.ndarray:
    """`bench_outside_truths`' ``logit_lin`` (logit p = a_i + b_i·w, a_i ~ N(−2.8, 0.6²),
    b_i = 0.06·e^N(0, 0.6²)) as the straight rise in seconds: θ = (a at the shortest wait,
    σ_u, τ, δ = the median slope over the waits' range)."""
    w = np.exp(data.x)
    return np.array([-2.8 + 0.06 * w.min(), 0.6, 0.6, 0.06 * (w.max() - w.min())])


def own_study(seed: int, folder: Path, n_part: int, n_prompts: int,
              fixed_seed: bool = False) -> dict[str, Any]:
    """One study: the outside design's waits, switches from the test's own alternative at
    the truth's parameters, through the CLI (`bench_outside_truths.cli_command`)."""
    frame = outside_study(TRUTH, DESIGN, n_part, n_prompts, seed)
    data = _data(frame)
    y = simulate_alternative(LINEAR_SECONDS, truth_theta(data), data, 1.0,
                             np.random.default_rng(10_000 + seed))
    path = folder / f"own_{seed}.csv"
    frame.assign(switched=y.astype(int)).to_csv(path, index=False)
    done = subprocess.run(cli_command(path, None if fixed_seed else seed),
                          capture_output=True, text=True, check=True)
    out = json.loads(done.stdout)
    test = out.get("alternatives") or {}
    return {"seed": seed, "found": bool(out["found"]), "best": test.get("best"),
            "stat": test.get("stat"), "p": test.get("p_value")}


def run_own(args: argparse.Namespace) -> None:
    """``--mode own``: claims among studies drawn by the test's own alternative."""
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.workers) as pool:
        for row in pool.map(lambda s: own_study(s, Path(tmp), 30, 80, args.fixed_seed),
                            seeds):
            rows.append(row)
            if args.jsonl:
                with args.jsonl.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    k = sum(r["found"] for r in rows)
    lo, hi = wilson(k, len(rows))
    stats = np.array([r["stat"] for r in rows], float)
    print(f"own alternative, {DESIGN} waits, 30 x 80: claimed {k}/{len(rows)} "
          f"({100 * lo:.1f}-{100 * hi:.1f} %); T quantiles 10/50/90/95 %: "
          f"{np.round(np.quantile(stats, [0.1, 0.5, 0.9, 0.95]), 2).tolist()}")


def run_sensitivity(args: argparse.Namespace) -> None:
    """``--mode sensitivity``: the in-test null at θ̂ and at θ̂ with one parameter scaled."""
    frame = outside_study(TRUTH, DESIGN, 30, 80, args.study)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"outside_{args.study}.csv"
        frame.to_csv(path, index=False)
        done = subprocess.run(cli_command(path, None), capture_output=True, text=True,
                              check=True)
    test = json.loads(done.stdout)["alternatives"]
    kind, stat = test["best"], float(test["stat"])
    theta, hinge = np.array(test["params"][kind]), np.array(test["params"]["hinge"])
    print(f"study {args.study}: T = {stat:.2f} against {kind}, θ̂ = {np.round(theta, 2)}")
    variants = {"θ̂": theta}
    if kind == LINEAR_SECONDS:
        for name, k, f in (("σ_u × 0.6", 1, 0.6), ("σ_u × 1.4", 1, 1.4), ("τ × 0.6", 2, 0.6),
                           ("τ × 1.4", 2, 1.4), ("δ × 0.8", 3, 0.8), ("δ × 1.25", 3, 1.25)):
            variants[name] = theta.copy()
            variants[name][k] *= f
    data = _data(frame)
    seeds = np.random.SeedSequence(7).generate_state(args.n)
    for name, th in variants.items():
        null = np.array(run_jobs(_replicate, [(kind, th, hinge, data, 1.0, int(s))
                                              for s in seeds], args.workers))
        print(f"{name:10s} T* median {np.median(null):6.2f}, 90 % {np.quantile(null, 0.9):6.2f}, "
              f"max {null.max():6.2f}; replicates >= T: {int((null >= stat).sum())}/{args.n}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("own", "sensitivity"), required=True)
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--study", type=int, default=150, help="the outside study (sensitivity)")
    ap.add_argument("--n", type=int, default=39, help="replicates per null (sensitivity)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", type=Path, help="append one JSON line per study here (own)")
    ap.add_argument("--fixed-seed", action="store_true",
                    help="own: the CLI's default seed for every study (the runs of 2026-11-30)")
    args = ap.parse_args(argv)
    (run_own if args.mode == "own" else run_sensitivity)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
