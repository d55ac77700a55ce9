"""The threshold test against truths written outside flowtrial's simulator (issue 27).

`analysis.threshold_truth` was written beside the estimator, so a benchmark that only uses it
can share the estimator's blind spots. Here switch data come from a few lines of numpy that
import nothing of flowtrial, with other parametrisations and other wait designs, and go
through `flowtrial threshold --json` exactly as a researcher's CSV would (a subprocess per
study, the CLI's default settings but ``--seed``: each study's own seed also seeds its
bootstrap replicates, so their Monte Carlo draws are independent across studies; with
``--fixed-seed`` every study uses the CLI's default 0, as the runs before 2026-11-30 did):

* truths without a threshold: ``hazard`` (background + constant hazard per second, person
  rates log-normal), ``logit`` (logistic in log wait, people's intercepts and slopes normal),
  ``logit_lin`` (logistic in the wait in *seconds*, people's slopes log-normal),
  ``logit_lin_n`` (the same with people's slopes normal, about one in ten falling);
* wait designs: ``lognorm`` (median 6 s, log-sd 1), ``uniform`` (0.5–40 s, uniform in
  seconds), ``arms`` (four latency arms 1, 3, 9, 27 s, jittered).

It prints, per (truth, design, size), the studies called a threshold with a Wilson 95 %
interval and the best alternative's counts.

Usage: python benchmarks/bench_outside_truths.py [--truths hazard,logit,logit_lin,logit_lin_n]
       [--designs lognorm,uniform,arms] [--sizes 30x80] [--seeds 20] [--first-seed 1]
       [--workers 2] [--jsonl FILE] [--fixed-seed]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threshold_families import wilson  # noqa: E402  (a sibling script, not the package)

TRUTHS = ("hazard", "logit", "logit_lin", "logit_lin_n")
DESIGNS = ("lognorm", "uniform", "arms")


def _waits(rng: np.random.Generator, design: str, n: int) -> np.ndarray:
    if design == "lognorm":
        return np.exp(rng.normal(np.log(6.0), 1.0, n)).clip(0.3, 120)
    if design == "uniform":
        return rng.uniform(0.5, 40.0, n)
    return rng.choice([1.0, 3.0, 9.0, 27.0], n) * np.exp(rng.normal(0, 0.25, n))


def _p_switch(rng: np.random.Generator, truth: str, w: np.ndarray) -> np.ndarray:
    """One person's switch probabilities at waits ``w`` (their effects drawn here)."""
    if truth == "hazard":
        lam = 0.02 * np.exp(rng.normal(0, 0.8))
        bg = 1 / (1 + np.exp(-rng.normal(-3.0, 0.6)))
        return np.asarray(1 - (1 - bg) * np.exp(-lam * w))
    if truth == "logit":
        a, b = rng.normal(-2.5, 0.8), max(0.0, rng.normal(0.9, 0.5))
        return np.asarray(1 / (1 + np.exp(-(a + b * np.log(w)))))
    if truth == "logit_lin_n":  # slopes normal: some people switch less the longer they wait
        a, b = rng.normal(-2.5, 0.6), rng.normal(0.05, 0.04)
        return np.asarray(1 / (1 + np.exp(-(a + b * w))))
    a, b = rng.normal(-2.8, 0.6), 0.06 * np.exp(rng.normal(0, 0.6))
    return np.asarray(1 / (1 + np.exp(-(a + b * w))))


def outside_study(truth: str, design: str, n_part: int, n_prompts: int,
                  seed: int) -> pd.DataFrame:
    """One study's cycles (`participant_id`, `wait_s`, `switched`)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n_part):
        w = _waits(rng, design, n_prompts)
        y = rng.random(n_prompts) < _p_switch(rng, truth, w)
        frames.append(pd.DataFrame({"participant_id": f"p{i:03d}", "wait_s": w.round(3),
                                    "switched": y.astype(int)}))
    return pd.concat(frames, ignore_index=True)


def cli_command(path: Path, seed: int | None) -> list[str]:
    """`flowtrial threshold --json` on one CSV, one worker; ``seed``: the analysis's seed
    (its bootstrap replicates), None for the CLI's default (0, the same replicate seeds for
    every study, as the runs before 2026-11-30 had)."""
    cmd = [sys.executable, "-m", "flowtrial", "threshold", str(path), "--json", "--workers", "1"]
    return cmd if seed is None else [*cmd, "--seed", str(seed)]


def run_one(job: tuple[str, str, int, int, int], folder: Path,
            fixed_seed: bool = False) -> dict[str, Any]:
    """Write one study as CSV and run `flowtrial threshold --json` on it (one worker; the
    study's seed seeds its replicates too, unless ``fixed_seed``)."""
    truth, design, n_part, n_prompts, seed = job
    path = folder / f"{truth}_{design}_{n_part}x{n_prompts}_{seed}.csv"
    outside_study(truth, design, n_part, n_prompts, seed).to_csv(path, index=False)
    cmd = cli_command(path, None if fixed_seed else seed)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    row: dict[str, Any] = {"truth": truth, "design": design, "size": f"{n_part}x{n_prompts}",
                           "seed": seed, "exit": done.returncode}
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-1:]}
    out = json.loads(done.stdout)
    alt = out.get("alternatives") or {}
    return {**row, "found": bool(out["found"]), "best": alt.get("best"),
            "p": alt.get("p_value"), "psi": (out.get("personal") or {}).get("median_psi_s")}


def table(rows: list[dict[str, Any]]) -> None:
    """Per (truth, design, size): claimed / studies (Wilson 95 %), best alternatives."""
    from rich.console import Console
    from rich.table import Table

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["truth"], r["design"], r["size"])].append(r)
    out = Table("truth", "design", "size", "claimed (Wilson 95 %)", "best alternative",
                "errors", title="Threshold claimed under outside no-threshold truths")
    for key in sorted(groups):
        ok = [r for r in groups[key] if "error" not in r]
        k = sum(r["found"] for r in ok)
        lo, hi = wilson(k, len(ok))
        best = ", ".join(f"{b} {n}" for b, n in Counter(r["best"] for r in ok).most_common())
        out.add_row(*key, f"{k}/{len(ok)} ({100 * lo:.1f}–{100 * hi:.1f} %)", best,
                    str(len(groups[key]) - len(ok)))
    Console().print(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truths", default=",".join(TRUTHS))
    ap.add_argument("--designs", default=",".join(DESIGNS))
    ap.add_argument("--sizes", default="30x80")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", type=Path, help="append one JSON line per study here")
    ap.add_argument("--fixed-seed", action="store_true",
                    help="the CLI's default seed for every study (the runs before 2026-11-30)")
    args = ap.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    jobs = [(t, d, p, k, s) for p, k in sizes for t in args.truths.split(",")
            for d in args.designs.split(",")
            for s in range(args.first_seed, args.first_seed + args.seeds)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.workers) as pool:
        for row in pool.map(lambda j: run_one(j, Path(tmp), args.fixed_seed), jobs):
            rows.append(row)
            if args.jsonl:
                with args.jsonl.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
