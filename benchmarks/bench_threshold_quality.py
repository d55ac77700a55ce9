"""Quality benchmark of the flow-threshold estimators: the personal threshold (headline,
`analysis.personal_threshold.fit_personal_threshold`) and the pooled onset ψ*
(`analysis.threshold.fit_threshold`, kept for comparison).

Studies come from the project's own virtual simulator (`study.simulator`, the analysis's
cycle table and switch rule, as `flowtrial analyze` sees them): a per-prompt study with TTFT
log-uniform on the cell's range, median personal threshold ψ (default 5.5 s, a value the
tests never use), log-sd τ across people. The detection share (switches the 10 s rule counts)
is estimated from the data (`estimate_detection_share`: switched / switched_2s), as in the
report. Cells:

* ``hinge``       τ = 0.35, TTFT 0.2–30 s;
* ``hinge_tau0``  τ = 0 (everyone has the same threshold);
* ``intercepts``  τ = 0.35 plus random intercepts (sd 0.5 on the logit scale);
* ``narrow``      τ = 0.35, TTFT 2–15 s (a narrow wait range);
* ``smooth``      a smooth logistic truth (no threshold);
* ``flat``        no dependence on the wait (the null).

With ``--agent-steps K`` (K > 1) every cell also runs as an agent study: each prompt a turn of
K model calls (K − 1 tool calls, tool time ``SimParams.tool_time`` between them, then the
answer), the person waiting for the whole turn and switching on the turn's idle wait (the
ground truth is per turn). Its per-call TTFT range is the chat cell's divided by K, so the
turn waits (K × TTFT + tool time + the answer) span the threshold as the chat waits do (the
study design an agent study needs: with the chat range per call, nearly every turn would wait
longer than ψ). The analysis sees the turn as the unit (``cycle_table_from_frames``).

Per cell it prints bias and 95 % CI coverage of the median personal ψ and of τ, the rate of
p(τ = 0) < 0.05, the pooled ψ̂'s coverage of ψ* (its pseudo-true value, from the expected
*counted* switch probability) and of the median ψ, the existence test's rejection rate and
the verdict rate ("found", `analysis.threshold_verdict.personal_verdict`: the rules of the
report), and the wall time of one full 100 × 200 analysis (with the threshold test).

With ``--families`` it instead runs the truth families of `threshold_families.py` (smooth
with person slopes, memoryless hazard, slope heterogeneity, bimodal thresholds, unbalanced
participants; issue 27, and the same truths at a reviewer's other parameter values:
`hazard_steep`, `hazard_narrow`, `logistic_wide`, `hinge_fast`, `hinge_slow`) through the
CLI's analysis path and prints, per family and size, the rate of threshold claims with its
Wilson 95 % CI, ψ̂ bias, CI and τ coverage (against the family's own ψ and τ) and the time
per analysis.

Usage: python benchmarks/bench_threshold_quality.py [--sizes 30x80,100x200] [--seeds 20]
       [--cells hinge,hinge_tau0,intercepts,narrow,smooth,flat] [--workers 2]
       [--agent-steps 5] [--families [flat,hazard,...]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# One BLAS thread per worker process: the workers already use the cores.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

CELLS: dict[str, dict[str, Any]] = {
    "hinge": {"truth": "hinge", "tau": 0.35},
    "hinge_tau0": {"truth": "hinge", "tau": 0.0},
    "intercepts": {"truth": "hinge", "tau": 0.35, "intercept_sd": 0.5},
    "narrow": {"truth": "hinge", "tau": 0.35, "ttft_ms": (2000, 15000)},
    "smooth": {"truth": "smooth", "tau": 0.35},
    "flat": {"truth": "flat", "tau": 0.35},
}


def simulate_cycles(cell: dict[str, Any], n_part: int, n_prompts: int, psi: float,
                    seed: int, steps: int = 1) -> tuple[Any, Any, Any]:
    """(analysable cycles, SimParams, study config) of one simulated per-prompt study; with
    ``steps`` > 1 an agent study (one row per turn, per-call TTFT range divided by K)."""
    import numpy as np

    from flowtrial.analysis.metrics import cycle_table_from_frames, frames_from_tables
    from flowtrial.study.config import example_study_text, parse_study
    from flowtrial.study.simulator import SimParams, simulate_virtual_frames

    data = tomllib.loads(example_study_text())
    lo, hi = (v / steps for v in cell.get("ttft_ms", (200, 30000)))
    data["per_prompt"] = {"ttft_ms": {"min": lo, "max": hi, "scale": "log"}}
    data["study"]["seed"] = seed
    config = parse_study(data)
    params = SimParams(truth=cell["truth"], threshold_s=psi, threshold_logsd=cell["tau"],
                       switch_intercept_sd=cell.get("intercept_sd", 0.0))
    tables = simulate_virtual_frames(config, params, n_part, tasks=1,
                                     prompts_per_task=n_prompts, seed=seed, design_seed=seed,
                                     agent_steps=steps)
    cycles = cycle_table_from_frames(frames_from_tables(tables, config))
    assert cycles.attrs["wait_unit"]["unit"] == ("turn" if steps > 1 else "cycle")
    ok = cycles[(cycles["status"] == "ok") & np.isfinite(cycles["idle_wait_s"])
                & (cycles["idle_wait_s"] > 0)]
    return ok, params, config


def one_study(job: tuple[str, int, int, int, dict[str, Any], int]) -> dict[str, Any]:
    """Simulate and analyse one study; the figures the benchmark aggregates."""
    import pandas as pd

    from flowtrial.analysis.personal_threshold import estimate_detection_share
    from flowtrial.analysis.threshold import fit_threshold
    from flowtrial.analysis.threshold_truth import pseudo_true_psi
    from flowtrial.analysis.threshold_verdict import fit_personal_and_test, personal_verdict
    from flowtrial.study.simulator.params import detection_share, expected_switch_probability

    cell_name, n_part, n_prompts, seed, cfg, steps = job
    cell = CELLS[cell_name]
    t0 = time.perf_counter()
    ok, params, config = simulate_cycles(cell, n_part, n_prompts, cfg["psi"], seed, steps)
    frame = pd.DataFrame({"participant_id": ok["participant_id"].to_numpy(),
                          "wait_s": ok["idle_wait_s"].to_numpy(float),
                          "switched": ok["switched"].astype(int).to_numpy()})
    d_true = detection_share(params, config.capture.switch_min_away_s)
    d_hat = estimate_detection_share(ok["switched"], ok["switched_2s"])
    pooled = fit_threshold(frame, n_boot=cfg["n_boot"], n_null=cfg["n_boot"], seed=seed)
    row: dict[str, Any] = {"cell": cell_name, "size": f"{n_part}x{n_prompts}", "seed": seed,
                           "steps": steps,
                           "below_psi": float((frame["wait_s"] < cfg["psi"]).mean()),
                           "d_true": d_true, "d_hat": d_hat, "pooled_psi": pooled.psi_s,
                           "pooled_ci": pooled.ci_s, "p_exists": pooled.p_exists,
                           "pooled_found": pooled.found}
    if cell["truth"] == "hinge":
        w = frame["wait_s"].to_numpy(float)
        row["psi_star"] = pseudo_true_psi(w, d_true * expected_switch_probability(w, params))
    if cfg.get("pooled_only"):
        row["seconds"] = time.perf_counter() - t0
        return row  # the existence test's false-positive rate needs only the pooled fit
    try:
        r, test = fit_personal_and_test(frame, detection_share=d_hat, workers=1,
                                        node_check=cfg["node_check"], seed=seed)
    except Exception as exc:  # noqa: BLE001 - a failed fit is a benchmark figure too
        row.update(error=f"{type(exc).__name__}: {exc}")
    else:
        found, _ = personal_verdict(r.to_dict(), pooled.to_dict(),
                                    frame["wait_s"].to_numpy(float), test=test.to_dict())
        row.update(median_psi=r.median_psi_s, ci=r.ci_s, tau=r.tau, tau_ci=r.tau_ci,
                   p_tau=r.p_tau_zero, b=r.slope_b, p_threshold=test.p_value,
                   node=(r.node_check or {}).get("rel_change_median_psi"), found=found)
    row["seconds"] = time.perf_counter() - t0
    return row


def timing(psi: float, workers: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one full analysis of a 100 × 200 study: pooled ψ* (200
    bootstrap + 200 null refits) and the personal threshold with its node check, on
    ``workers``. CPU counts this process and its workers: on a shared machine the wall time
    depends on the other load, the CPU time does not."""
    import resource

    import pandas as pd

    from flowtrial.analysis.personal_threshold import estimate_detection_share
    from flowtrial.analysis.threshold import fit_threshold
    from flowtrial.analysis.threshold_verdict import fit_personal_and_test

    ok, _, _ = simulate_cycles(CELLS["intercepts"], 100, 200, psi, 99)
    frame = pd.DataFrame({"participant_id": ok["participant_id"].to_numpy(),
                          "wait_s": ok["idle_wait_s"].to_numpy(float),
                          "switched": ok["switched"].astype(int).to_numpy()})
    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    fit_threshold(frame, n_boot=200, n_null=200, seed=0)
    fit_personal_and_test(frame, workers=workers,
                          detection_share=estimate_detection_share(ok["switched"],
                                                                   ok["switched_2s"]))
    return time.perf_counter() - t0, cpu() - c0


def _rate(rows: list[dict[str, Any]], pred: Any) -> tuple[int, int]:
    return sum(1 for r in rows if pred(r)), len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="30x80,100x200", help="participants x prompts, ...")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--seeds", type=int, default=20, help="simulated studies per cell")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--psi", type=float, default=5.5, help="median personal threshold (s)")
    ap.add_argument("--n-boot", type=int, default=100, help="pooled bootstrap/null refits")
    ap.add_argument("--node-check", action="store_true", help="refit with 48 × 11 nodes")
    ap.add_argument("--pooled-only", action="store_true",
                    help="skip the personal fit (e.g. many flat studies for the existence "
                         "test's false-positive rate)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--agent-steps", type=int, default=1,
                    help="K > 1: also run every cell as an agent study of K calls per turn")
    ap.add_argument("--families", nargs="?", const="all", default=None,
                    help="run the truth families (all, or a comma list) instead of the cells")
    ap.add_argument("--gradual-onsets", choices=("auto", "on", "off"), default="auto",
                    help="families: the gradual onsets (rounded onset, S-curve) among the "
                         "test's alternatives (auto: from 9,600 cycles, as flowtrial threshold "
                         "does)")
    ap.add_argument("--quadrature", choices=("plain", "adaptive"), default="adaptive",
                    help="the personal fit's quadrature (families only)")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--timing-only", action="store_true", help="only the 100 × 200 timing")
    ap.add_argument("--jsonl", type=Path, help="also append every study's figures here")
    ap.add_argument("--from-jsonl", type=Path, nargs="+",
                    help="only summarise studies already in these --jsonl files")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    console = Console(width=200)
    if args.families:
        return run_families(args, console)
    if args.timing_only:
        wall, cpu = timing(args.psi, args.workers)
        console.print(f"one full 100 × 200 analysis, {args.workers} worker(s): {wall:.1f} s "
                      f"wall (target <= 120 s), {cpu:.1f} s CPU")
        return 0
    cfg = {"psi": args.psi, "n_boot": args.n_boot, "node_check": args.node_check,
           "pooled_only": args.pooled_only}
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    variants = [1] + ([args.agent_steps] if args.agent_steps > 1 else [])
    jobs = [(c, p, k, args.first_seed + i, cfg, st) for p, k in sizes for c in cells
            for st in variants for i in range(args.seeds)]
    # Big studies first, so the pool is not left with one long job at the end.
    jobs.sort(key=lambda j: -j[1] * j[2])
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if args.from_jsonl:
        jobs = []
        for f in args.from_jsonl:
            results += [json.loads(line) for line in f.read_text().splitlines() if line]
        sizes = sorted({tuple(int(v) for v in r["size"].split("x")) for r in results})
        cells = [c for c in CELLS if any(r["cell"] == c for r in results)]
        variants = sorted({r.get("steps", 1) for r in results})
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("simulated studies", total=len(jobs))
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            for res in pool.map(one_study, jobs):
                results.append(res)
                if args.jsonl:
                    with args.jsonl.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
                progress.advance(task)
    elapsed = time.perf_counter() - t0

    table = Table(title=f"Flow-threshold estimators: median personal ψ = {args.psi:g} s")
    for col in ("size", "cell", "calls", "< ψ", "n", "mean ψ̂ (bias)", "cover ψ", "mean τ̂",
                "cover τ", "p_τ<.05", "pooled ψ̂", "pooled cover ψ*", "pooled cover ψ",
                "p_exists<.05",
                "found", "fails"):
        table.add_column(col, justify="left" if col in ("size", "cell") else "right")
    for p, k, c, st in [(p, k, c, st) for p, k in sizes for c in cells for st in variants]:
        rows = [r for r in results if r["cell"] == c and r["size"] == f"{p}x{k}"
                and r.get("steps", 1) == st]
        if not rows:
            continue
        good = [r for r in rows if "median_psi" in r]  # personal fit done (not skipped)
        failed = sum("error" in r for r in rows)
        tau = CELLS[c]["tau"]
        hinge = CELLS[c]["truth"] == "hinge"

        def frac(sel: list[dict[str, Any]], pred: Any) -> str:
            a, n = _rate(sel, pred)
            return f"{a}/{n}" if n else "—"

        if good:
            geo = math.exp(sum(math.log(r["median_psi"]) for r in good) / len(good))
            psi_txt = f"{geo:.2f} ({100 * (geo / args.psi - 1):+.1f} %)"
            tau_txt = f"{sum(r['tau'] for r in good) / len(good):.3f}"
        else:
            psi_txt = tau_txt = "—"
        pooled_geo = math.exp(sum(math.log(r["pooled_psi"]) for r in rows) / len(rows))
        table.add_row(
            f"{p}×{k}", c, "1" if st == 1 else f"{st} (turn)",
            f"{sum(r.get('below_psi', math.nan) for r in rows) / len(rows):.0%}",
            str(len(rows)),
            psi_txt if hinge else "—",
            frac(good, lambda r: r["ci"][0] <= args.psi <= r["ci"][1]) if hinge else "—",
            tau_txt if hinge else "—",
            frac(good, lambda r, t=tau: r["tau_ci"][0] <= t <= r["tau_ci"][1])
            if hinge else "—",
            frac(good, lambda r: r["p_tau"] < 0.05),
            f"{pooled_geo:.2f}",
            frac(rows, lambda r: r["pooled_ci"][0] <= r["psi_star"] <= r["pooled_ci"][1])
            if hinge else "—",
            frac(rows, lambda r: r["pooled_ci"][0] <= args.psi <= r["pooled_ci"][1])
            if hinge else "—",
            frac(rows, lambda r: r["p_exists"] < 0.05),
            frac(good, lambda r: r["found"]),
            str(failed),
        )
    console.print(table)
    nodes = [abs(r["node"]) for r in results if r.get("node") is not None]
    if nodes:
        console.print(f"node check (48×11 vs 24×7): median |Δψ|/ψ = "
                      f"{sorted(nodes)[len(nodes) // 2]:.4f}, max {max(nodes):.4f}")
    for r in results:
        if "error" in r:
            console.print(f"failed fit: {r['cell']} {r['size']} seed {r['seed']}: {r['error']}")
    per = {}
    for r in results:
        per.setdefault(r["size"], []).append(r["seconds"])
    console.print(f"{len(results)} studies in {elapsed:.0f} s with {args.workers} worker(s); "
                  + ", ".join(f"{s}: {sum(v) / len(v):.1f} s wall per study and worker"
                              for s, v in per.items()))
    if not args.skip_timing and not args.from_jsonl:
        wall, cpu = timing(args.psi, args.workers)
        console.print(f"one full 100 × 200 analysis (pooled ψ* 200+200 refits + personal "
                      f"threshold with node check), {args.workers} worker(s): {wall:.1f} s "
                      f"wall (target <= 120 s), {cpu:.1f} s CPU")
    return 0


def run_families(args: argparse.Namespace, console: Any) -> int:
    """The ``--families`` mode: simulate, analyse (two workers), print the family table."""
    from threshold_families import FAMILIES, family_study, family_table

    names = list(FAMILIES) if args.families == "all" else args.families.split(",")
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    cfg = {"n_boot": args.n_boot, "quadrature": args.quadrature,
           "onsets": {"auto": None, "on": True, "off": False}[args.gradual_onsets]}
    results: list[dict[str, Any]] = []
    if args.from_jsonl:
        for f in args.from_jsonl:
            results += [json.loads(line) for line in f.read_text().splitlines() if line]
    else:
        # Seed-major order within a size, so a run stopped early covers every family evenly.
        jobs = [(f, p, k, args.first_seed + i, cfg) for p, k in sizes
                for i in range(args.seeds) for f in names]
        # Loaded before the workers fork: they run the code as it was at the start.
        import flowtrial.analysis.threshold_verdict  # noqa: F401

        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            for fut in as_completed([pool.submit(family_study, j) for j in jobs]):
                res = fut.result()
                results.append(res)
                if args.jsonl:
                    with args.jsonl.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
        console.print(f"{len(results)} studies in {time.perf_counter() - t0:.0f} s with "
                      f"{args.workers} worker(s)")
    family_table(results, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
