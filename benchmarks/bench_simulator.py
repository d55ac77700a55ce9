"""Virtual simulator speed: simulated studies per minute on one core.

A study here is 30 participants × 60 prompts (4 tasks × 15), the size a power analysis
replicates many times. Two figures: in memory (``simulate_virtual_frames``, what power
analysis uses) and into a fresh SQLite database (``init_db`` + ``simulate_virtual``:
enrollment, then tasks, cycles, events and ground truth with executemany).

    python benchmarks/bench_simulator.py [--studies 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tomllib
from pathlib import Path

from flowtrial.study.config import example_study_text, parse_study
from flowtrial.study.simulator import SimParams, simulate_virtual, simulate_virtual_frames
from flowtrial.study.storage import init_db

PARTICIPANTS, TASKS, PROMPTS_PER_TASK = 30, 4, 15


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    args = ap.parse_args()
    config = parse_study(tomllib.loads(example_study_text()))
    params = SimParams()
    simulate_virtual_frames(config, params, 2, 1, 2, seed=0)  # warm imports

    t0 = time.perf_counter()
    cycles = 0
    for i in range(args.studies):
        frames = simulate_virtual_frames(config, params, PARTICIPANTS, TASKS, PROMPTS_PER_TASK,
                                         seed=i, design_seed=i)
        cycles += len(frames["cycles"])
    mem = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for i in range(args.studies):
            db = init_db(Path(tmp) / f"study{i}.db", config)
            simulate_virtual(db, config, params, PARTICIPANTS, TASKS, PROMPTS_PER_TASK, seed=i)
            db.dispose()
        disk = time.perf_counter() - t0

    size = f"{PARTICIPANTS} participants × {TASKS * PROMPTS_PER_TASK} prompts"
    print(f"virtual simulator, {args.studies} studies of {size} ({cycles // args.studies} "
          "cycles each), one process:")
    print(f"  in memory (simulate_virtual_frames): {mem / args.studies * 1000:7.0f} ms/study  "
          f"{60 * args.studies / mem:7.0f} studies/minute")
    print(f"  SQLite database (init_db + simulate_virtual): {disk / args.studies * 1000:7.0f} "
          f"ms/study  {60 * args.studies / disk:7.0f} studies/minute")


if __name__ == "__main__":
    main()
