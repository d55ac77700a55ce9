"""Benchmark: a full `flowtrial analyze` on 100 participants × 200 cycles (target ≤ 30 s on
2 cores).

Simulates a per-prompt study in a temporary database (virtual mode), then times
``run_analysis`` end to end (metrics, checks, threshold + sensitivity fits with 200 bootstrap
and 200 null replicates, secondary outcomes, figures, HTML). Prints the figures.

    python benchmarks/bench_analyze.py [--participants 100] [--cycles 200] [--n-boot 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tomllib
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--participants", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=200, help="cycles per participant")
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    from flowtrial.analysis.metrics import cycle_table
    from flowtrial.analysis.report import run_analysis
    from flowtrial.study.config import example_study_text, parse_study
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db, open_db

    data = tomllib.loads(example_study_text())
    data["study"]["time_scale"] = args.time_scale
    config = parse_study(data)
    tasks = 4
    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "study.db"
        t0 = time.perf_counter()
        database = init_db(db_path, config)
        simulate_virtual(database, config, SimParams(), args.participants, tasks=tasks,
                         prompts_per_task=max(1, args.cycles // tasks), seed=args.seed)
        database.dispose()
        t_sim = time.perf_counter() - t0

        t0 = time.perf_counter()
        database = open_db(db_path)
        n = len(cycle_table(database))
        database.dispose()
        t_metrics = time.perf_counter() - t0

        t0 = time.perf_counter()
        results = run_analysis(db_path, Path(tmp) / "report", n_boot=args.n_boot, seed=0,
                               progress=True)
        t_total = time.perf_counter() - t0
        html_kb = (Path(tmp) / "report" / "report.html").stat().st_size / 1024

    thr = results["threshold"]
    print(f"cores available:        {os.cpu_count()}")
    print(f"simulate (DB write):    {t_sim:6.2f} s")
    print(f"cycle_table ({n} cycles): {t_metrics:6.2f} s")
    print(f"full analyze:           {t_total:6.2f} s  (target <= 30 s)")
    print(f"report.html:            {html_kb:6.0f} kB, figures: {', '.join(results['figures'])}")
    ci = thr.get("ci_s") or [float("nan")] * 2
    print(f"psi = {thr.get('psi_s') or float('nan'):.2f} s (CI {ci[0]:.2f}-{ci[1]:.2f}), "
          f"found={thr.get('found')}, true psi = 8 s")


if __name__ == "__main__":
    main()
