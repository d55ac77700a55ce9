"""How long `flowtrial --help` (and `flowtrial CMD --help`) take, and what they import.

Each figure is the median of ``--runs`` fresh interpreters, printed beside the machine's own
floor: a bare ``python -c pass`` and ``python -c "import typer"`` (the CLI framework alone),
measured in the same run, so the ratio says what flowtrial adds.

To measure an older commit (before the lazy CLI, the module was ``study.cli``)::

    git worktree add /tmp/old 1af33ed
    python benchmarks/bench_cli_startup.py --module study.cli --cwd /tmp/old

Usage: python benchmarks/bench_cli_startup.py [--runs 7] [--module flowtrial.cli]
       [--cwd DIR] [--commands proxy analyze]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("pandas", "scipy", "sqlalchemy", "starlette", "uvicorn", "streamlit", "statsmodels",
         "pyarrow")

PROBE = """
import contextlib, io, json, sys
argv, module, heavy = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
sys.argv = ["flowtrial", *argv]
main = __import__(module, fromlist=["main"]).main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
print(json.dumps({"modules": len(sys.modules),
                  "heavy": [m for m in heavy if m in sys.modules]}))
"""


def timed(argv: list[str], cwd: Path | None) -> tuple[float, str]:
    """Wall seconds of one fresh interpreter running ``argv``, and its stdout."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=True)
    return time.perf_counter() - start, proc.stdout


def median_run(argv: list[str], runs: int, cwd: Path | None) -> tuple[float, float, str]:
    times, out = [], ""
    for _ in range(runs):
        seconds, out = timed(argv, cwd)
        times.append(seconds)
    return statistics.median(times), min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--module", default="flowtrial.cli", help="the CLI module (has main())")
    ap.add_argument("--cwd", type=Path, default=None, help="run from this folder")
    ap.add_argument("--commands", nargs="*", default=["proxy", "analyze", "dashboard"])
    args = ap.parse_args()

    py = sys.executable
    rows: list[tuple[str, float, float, str]] = []
    for label, argv in (("python -c pass (floor)", [py, "-c", "pass"]),
                        ("import typer (framework)", [py, "-c", "import typer"])):
        med, best, _ = median_run(argv, args.runs, args.cwd)
        rows.append((label, med, best, ""))
    for command in [None, *args.commands]:
        cli_argv = ["--help"] if command is None else [command, "--help"]
        argv = [py, "-c", PROBE, json.dumps(cli_argv), args.module, json.dumps(HEAVY)]
        med, best, out = median_run(argv, args.runs, args.cwd)
        info = json.loads(out.splitlines()[-1])
        detail = f"{info['modules']} modules; heavy: {', '.join(info['heavy']) or 'none'}"
        rows.append((f"flowtrial {' '.join(cli_argv)}", med, best, detail))

    floor = rows[0][1]
    print(f"{'what':34} {'median s':>9} {'best s':>8} {'× floor':>8}  imports")
    for label, med, best, detail in rows:
        print(f"{label:34} {med:9.3f} {best:8.3f} {med / floor:8.1f}  {detail}")


if __name__ == "__main__":
    main()
