"""Time of one full flow-threshold analysis of a 100 × 200 study (issue 27's target: ≤ 120 s
on 2 cores), per truth family, beside this machine's floor measured in the same run.

A full analysis is `flowtrial threshold`'s (`analysis.threshold_verdict.analyse_threshold`):
the pooled ψ* with 200 bootstrap + 200 null refits, the personal threshold with its
random-slope, shape and quadrature checks, and the sequential threshold test (up to 19
replicates). Studies come from `threshold_families.py` (every switch counted).

The floor is a fixed kernel written here, so that it never changes with the code it
measures: the core of one likelihood evaluation at the threshold test's size — a linear
predictor, expit, log and a per-person sum over a (cycles × 300 nodes) array of a 100 × 200
study — the median of 5, single-threaded. (Until 2026-11-29 the floor was one evaluation of
the package's own hinge likelihood, ~200 ms; that changed when the likelihood got faster.)

On a shared machine the wall time moves with other people's load;
the ratio wall / floor moves less, so compare ratios within one run.

Usage: python benchmarks/bench_threshold_time.py [--families hinge,logistic_slopes,hazard]
       [--workers 2] [--size 100x200]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from threshold_families import family_data  # noqa: E402


def cpu_s() -> float:
    """CPU seconds of this process and its finished workers."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def study(name: str, n_part: int, n_prompts: int, seed: int):  # type: ignore[no-untyped-def]
    return family_data(name, n_part, n_prompts, seed)[["participant_id", "wait_s", "switched"]]


def floor_s(n_part: int, n_prompts: int) -> float:
    """The fixed kernel's time (module docstring)."""
    import numpy as np
    from scipy.special import expit

    rng = np.random.default_rng(0)
    n, q = n_part * n_prompts, 300
    lin = rng.normal(size=(n, 1))
    nodes = rng.normal(size=(1, q))
    starts = np.arange(0, n, n_prompts)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        eta = lin * nodes - 2.0
        np.log(expit(eta, out=eta), out=eta)
        np.add.reduceat(eta, starts, axis=0)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="hinge,logistic_slopes,hazard")
    ap.add_argument("--size", default="100x200")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1000)
    args = ap.parse_args(argv)
    from flowtrial.analysis.threshold_verdict import analyse_threshold

    n_part, n_prompts = (int(v) for v in args.size.split("x"))
    print(f"{args.size}, {args.workers} worker(s), cores {os.cpu_count()}", flush=True)
    for name in args.families.split(","):
        frame = study(name, n_part, n_prompts, args.seed)
        floor = floor_s(n_part, n_prompts)
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), cpu_s()
        out = analyse_threshold(frame, n_boot=200, n_null=200, seed=args.seed,
                                workers=args.workers)
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        test = out["alternatives"]
        print(f"{name:16s} wall {wall:6.1f} s (target <= 120)  CPU {cpu:6.1f} s  "
              f"floor {1000 * floor:6.1f} ms  wall/floor {wall / floor:7.0f}  "
              f"load {load0:.1f}->{os.getloadavg()[0]:.1f}  found={out['found']}  "
              f"test {test['n_boot']}/{test['n_max']} replicates, p={test['p_value']:.3g}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
