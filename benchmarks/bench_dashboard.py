"""Dashboard speed: first render of each page on a 100,000-cycle study (issue 7: ≤ 2 s).

Builds the study with the virtual simulator (100 participants × 10 tasks × 100 prompts,
≈ 30 s) unless ``--db`` names an existing one, then renders every page once with
``streamlit.testing.v1.AppTest`` in this process, caches cold, and prints the time of each
first render. Pages that need the analysis layer (Arms, Flow threshold) render at once and
fill their switch-based sections from a background worker; the time until they are complete
is printed too.

    python benchmarks/bench_dashboard.py [--db big.db] [--participants 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

# Run as a script, benchmarks/ is on sys.path, not the repository: put it first, so the
# packages resolve to their folders (not to namespace packages of the editable install).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAGES = ["pages/overview.py", "pages/timeline.py", "pages/arms.py", "pages/threshold.py",
         "pages/team.py"]
APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"


def build(path: Path, participants: int, tasks: int, prompts: int) -> int:
    from flowtrial.study.config import example_study_text, parse_study
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db

    text = example_study_text()
    config = parse_study(tomllib.loads(text))
    db = init_db(path, config, text)
    res = simulate_virtual(db, config, SimParams(), participants, tasks, prompts, seed=1)
    db.dispose()
    return res.cycles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, help="an existing study database to use instead")
    ap.add_argument("--participants", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--prompts-per-task", type=int, default=100)
    ap.add_argument("--complete-timeout", type=float, default=60.0)
    args = ap.parse_args()
    os.environ["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "bench.db"
            t0 = time.perf_counter()
            n = build(db, args.participants, args.tasks, args.prompts_per_task)
            print(f"built {n:,} cycles with the virtual simulator in "
                  f"{time.perf_counter() - t0:.1f} s")
        os.environ["FLOWTRIAL_DASHBOARD_DB"] = str(db)
        from streamlit.testing.v1 import AppTest

        t0 = time.perf_counter()
        import altair  # noqa: F401 - imports are paid once per server, not per page
        import scipy.stats  # noqa: F401
        import statsmodels.api  # noqa: F401

        import flowtrial.analysis.metrics  # noqa: F401  # FIXME-usage
        print(f"imports (once per server process): {time.perf_counter() - t0:.2f} s")
        at = AppTest.from_file(str(APP), default_timeout=120)
        print("first render of each page (caches cold):")
        worst = 0.0
        for page in PAGES:
            t0 = time.perf_counter()
            (at if page == PAGES[0] else at.switch_page(page)).run()
            dt = time.perf_counter() - t0
            worst = max(worst, dt)
            errors = len(at.exception) + len(at.error)
            pending = [i.value for i in at.info if "in a few seconds" in i.value]
            print(f"  {page:22s} {dt:6.2f} s  errors={errors}"
                  + ("  (switch sections pending)" if pending else ""))
            if pending:
                t1 = time.perf_counter()
                while pending and time.perf_counter() - t1 < args.complete_timeout:
                    time.sleep(0.5)
                    at.run()
                    pending = [i.value for i in at.info if "in a few seconds" in i.value]
                print(f"  {'':22s} complete after {dt + time.perf_counter() - t1:6.2f} s"
                      + ("  (timed out)" if pending else ""))
        print(f"slowest first render: {worst:.2f} s (target ≤ 2 s)")


if __name__ == "__main__":
    main()
