"""Plain against adaptive Gauss–Hermite quadrature for the random-slope hinge, where people
have many cycles each (`analysis/adaptive_fit.py`).

For each study (100 × 200 by default, people's slopes differing strongly: the
`hinge_strong` family, truth ψ = 6 s, κ = 0.8) the random-slope hinge is fitted from three
starts (τ̂ with κ 0.3, τ̂ with κ 0.8, τ̂/4 with κ 1.2; τ̂ from the plain no-slope fit) with the
personal fit's plain nodes (`SLOPE_NODES`) and with 12 × 5 × 5 adaptive nodes. Each optimum's
log-likelihood is also evaluated accurately (24 × 9 × 9 adaptive nodes, 6 rounds), so one
sees both the quadrature error and whether the starts agree.

Usage: python benchmarks/bench_quadrature.py [--family hinge_strong] [--size 100x200]
       [--seeds 1000,1001,1002]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from threshold_families import FAMILIES, family_data, family_truth  # noqa: E402

from flowtrial.analysis import personal_threshold as pt  # noqa: E402
from flowtrial.analysis.adaptive_fit import maximize_adaptive, start_adaptation  # noqa: E402
from flowtrial.analysis.rb_model import RandomBreakpointModel, maximize  # noqa: E402

STARTS = ((1.0, 0.3), (1.0, 0.8), (0.25, 1.2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="hinge_strong")
    ap.add_argument("--size", default="100x200")
    ap.add_argument("--seeds", default="1000,1001,1002")
    args = ap.parse_args(argv)
    n_part, n_prompts = (int(v) for v in args.size.split("x"))
    print(f"{args.family} {args.size} (truth ψ {family_truth(args.family)[0]:g} s, "
          f"{FAMILIES[args.family]})", flush=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        df = family_data(args.family, n_part, n_prompts, seed)
        data = pt._data(df)
        plain0 = RandomBreakpointModel(data, pt.DEFAULT_NODES)
        best = max((maximize(plain0, s) for s in pt.starts(data)), key=lambda f: f.loglik)
        accurate = RandomBreakpointModel(data, (24, 9, 9))
        for label, nodes, fit in (("plain", pt.SLOPE_NODES, maximize),
                                  ("adaptive", (12, 5, 5), maximize_adaptive)):
            model = RandomBreakpointModel(data, nodes)
            for tau_f, kappa in STARTS:
                start = np.r_[best.theta[:4], best.theta[4] * tau_f, kappa]
                t0 = time.perf_counter()
                f = fit(model, start)
                wall = time.perf_counter() - t0
                start_adaptation(accurate, f.theta, rounds=6)
                exact = -accurate.nll(f.theta, need_grad=False)[0]
                print(f"seed {seed} {label:8s} {nodes} start τ×{tau_f:g} κ {kappa:g}: "
                      f"ℓ {f.loglik:9.2f} (accurate {exact:9.2f})  ψ̂ "
                      f"{math.exp(f.theta[3]):5.2f} s  τ̂ {f.theta[4]:.2f}  κ̂ {f.theta[5]:.2f}"
                      f"  {wall:5.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
