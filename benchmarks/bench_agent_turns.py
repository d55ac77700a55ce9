"""Does a simulated agent study recover its turn-level threshold as well as a chat study?

Simulates studies with the full virtual simulator (`simulate_virtual_frames`, its defaults:
ψ = 8 s, log-sd 0.35 across people) as chat (one call per prompt) and as agent
turns (`--agent-steps K`: K − 1 tool calls with tool time between, then the answer), runs the
analysis's own per-cycle table (which waits on turns where turns have several calls) and the
threshold fit, and prints per case: median ψ̂, 95 % CI coverage of the population ψ, found
rate, and — for the agent studies — the same fit on the wrong unit (every cycle its own
wait), to show what analysing cycles would report.

It keeps the example study's per-call TTFT range (0.2–30 s), so it shows what an agent study
designed with chat arms gets: turns that nearly all wait longer than ψ, and a threshold that
is not found. For the quality of a properly designed agent study (per-call arms chosen so
the turn waits span ψ) see ``bench_threshold_quality.py --agent-steps K``.

Usage: python benchmarks/bench_agent_turns.py [--sims 20] [--participants 40]
       [--prompts 60] [--agent-steps 5] [--n-boot 100] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def one_study(job: tuple[str, int, dict[str, Any]]) -> dict[str, Any]:
    """Simulate one study and fit ψ on the analysis's unit (and, for agents, on cycles)."""
    import tomllib

    import numpy as np

    from flowtrial.analysis.metrics import cycle_table_from_frames, frames_from_tables
    from flowtrial.analysis.threshold import fit_threshold
    from flowtrial.study.config import example_study_text, parse_study
    from flowtrial.study.simulator.params import SimParams
    from flowtrial.study.simulator.virtual import simulate_virtual_frames

    case, seed, cfg = job
    steps = cfg["agent_steps"] if case != "chat" else 1
    data = tomllib.loads(example_study_text())  # per-prompt TTFT draws, as `flowtrial init`
    data["study"]["seed"] = seed
    config = parse_study(data)
    params = SimParams(threshold_s=cfg["psi"], threshold_logsd=cfg["psi_sd"])
    frames = simulate_virtual_frames(config, params, cfg["participants"], tasks=4,
                                     prompts_per_task=cfg["prompts"] // 4, seed=seed,
                                     agent_steps=steps)
    cycles = frames["cycles"]
    if case == "agent_as_cycles":
        cycles = cycles.drop(columns=["request_kind", "turn_id"])
    table = cycle_table_from_frames(frames_from_tables({**frames, "cycles": cycles}, config))
    ok = table[np.isfinite(table["idle_wait_s"].to_numpy(float))]
    df = ok.rename(columns={"idle_wait_s": "wait_s"})[["participant_id", "wait_s", "switched"]]
    df = df.assign(switched=df["switched"].astype(bool).astype(int))
    r = fit_threshold(df, n_boot=cfg["n_boot"], n_null=cfg["n_boot"], seed=seed)
    return {"case": case, "psi": r.psi_s, "ci": r.ci_s, "found": r.found, "units": len(df),
            "unit": table.attrs["wait_unit"]["unit"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=20, help="studies per case")
    ap.add_argument("--participants", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=60, help="prompts per participant")
    ap.add_argument("--agent-steps", type=int, default=5)
    ap.add_argument("--psi", type=float, default=8.0)
    ap.add_argument("--psi-sd", type=float, default=0.35)
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import numpy as np

    cfg = {"participants": args.participants, "prompts": args.prompts,
           "agent_steps": args.agent_steps, "psi": args.psi, "psi_sd": args.psi_sd,
           "n_boot": args.n_boot}
    cases = ["chat", "agent", "agent_as_cycles"]
    jobs = [(c, args.seed * 1_000_003 + i, cfg) for c in cases for i in range(args.sims)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(one_study, jobs, chunksize=2))
    print(f"{args.sims} studies per case, {args.participants} participants x {args.prompts} "
          f"prompts, agent steps {args.agent_steps}, psi {args.psi} s (log-sd {args.psi_sd}); "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'case':<16} {'unit':<6} {'units':>6} {'median psi':>10} {'coverage':>9} "
          f"{'found':>6}")
    for case in cases:
        rows = [r for r in results if r["case"] == case]
        psis = np.array([r["psi"] for r in rows if r["psi"] is not None], float)
        cover = np.mean([r["ci"] is not None and r["ci"][0] <= args.psi <= r["ci"][1]
                         for r in rows])
        found = np.mean([bool(r["found"]) for r in rows])
        print(f"{case:<16} {rows[0]['unit']:<6} {rows[0]['units']:>6} "
              f"{np.median(psis) if len(psis) else float('nan'):>10.2f} {cover:>9.2f} "
              f"{found:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
