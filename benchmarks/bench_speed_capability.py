"""Recovery of the speed and capability effects of a speed-vs-capability study.

Simulated studies (virtual, the `speed-vs-capability` template: a fast model, the same model
slowed to the slow model's latency, the slow model; crossover over 6 tasks) under several
truths, each replicate scored against its own sample's true contrasts (the same people and
tasks replayed under every arm). Per scenario, contrast and size: mean truth and estimate,
bias, power (p < 0.05) and CI coverage with Wilson 95 % intervals.

    python benchmarks/bench_speed_capability.py --sizes 12 24 48 --seeds 30

Scenarios (models as TTFT ms : tokens/s : P(good answer)):
  seeds      the seeds' question: spark 300:1000:0.40, codex 12000:40:0.80
  no-speed   speed cannot matter: the slow model is as quick to first token and faster
             than reading (ttft 600 ms, 150 tokens/s), codex stronger
  no-cap     capability cannot matter: both models 0.6, speeds as in `seeds`
  null       neither: two identical models
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tomllib

import pandas as pd

SCENARIOS = {
    "seeds": ((300, 1000, 0.40), (12000, 40, 0.80)),
    "no-speed": ((300, 1000, 0.40), (600, 150, 0.80)),
    "no-cap": ((300, 1000, 0.60), (12000, 40, 0.60)),
    "null": ((300, 1000, 0.60), (300, 1000, 0.60)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[12, 24, 48])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--prompts-per-task", type=int, default=10)
    args = ap.parse_args()

    from flowtrial.analysis.factorial_power import factorial_power
    from flowtrial.study.config import parse_study, speed_vs_capability_text
    from flowtrial.study.simulator import SimParams
    from flowtrial.study.simulator.capability import SimModel

    config = parse_study(tomllib.loads(speed_vs_capability_text()))
    print(f"# bench_speed_capability: {args.seeds} seeds, sizes {args.sizes}, "
          f"{args.tasks} tasks × ≤ {args.prompts_per_task} attempts, cpus {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    tables = []
    for name in args.scenarios:
        fast, slow = SCENARIOS[name]
        params = SimParams(models={
            "gpt-5.3-codex-spark": SimModel(ttft_ms=fast[0], tokens_per_second=fast[1],
                                            success=fast[2]),
            "gpt-5.3-codex": SimModel(ttft_ms=slow[0], tokens_per_second=slow[1],
                                      success=slow[2])})
        t0 = time.perf_counter()
        table = factorial_power(config, params, args.sizes, args.tasks, args.prompts_per_task,
                                args.seeds, seed=7).assign(scenario=name)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        tables.append(table)
    out = pd.concat(tables, ignore_index=True)
    fmt = lambda ci: f"{ci[0]:.2f}–{ci[1]:.2f}"  # noqa: E731
    print("| scenario | contrast | n | true | estimate | bias | power (95 % CI) | "
          "coverage (95 % CI) | s/study |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out.itertuples():
        print(f"| {r.scenario} | {r.contrast} | {r.participants} | {r.mean_truth:+.3f} | "
              f"{r.mean_estimate:+.3f} | {r.bias:+.3f} | {r.power:.2f} ({fmt(r.power_ci)}) | "
              f"{r.coverage:.2f} ({fmt(r.coverage_ci)}) | {r.seconds_per_study:.1f} |")


if __name__ == "__main__":
    main()
