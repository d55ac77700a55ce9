"""The team view's first render at scale: a generated observe study (``simulate_team``),
then the three team queries (``flowtrial.analysis.team``) as the page runs them, timed, and
the process's peak memory. Bounded: the default is 500 people × 52 weeks × 1 turn a working
day (130,000 turns, ~690,000 events); a year at 25 M model calls is ``--turns-per-day 40``.

    python benchmarks/bench_team_view.py [--people 500] [--weeks 52] [--turns-per-day 1]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import tomllib
from pathlib import Path

from flowtrial.analysis.team import TeamQuery, team_agents, team_wait_bins, team_weekly
from flowtrial.study.config import parse_study
from flowtrial.study.simulator.team import simulate_team
from flowtrial.study.storage import init_db
from flowtrial.study.team_turns import rebuild_team_turns

OBSERVE = '[study]\nname = "bench"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--people", type=int, default=500)
    ap.add_argument("--weeks", type=int, default=52)
    ap.add_argument("--turns-per-day", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = init_db(Path(tmp) / "team.db", parse_study(tomllib.loads(OBSERVE)), OBSERVE)
        t = time.perf_counter()
        n = simulate_team(db, args.people, args.weeks, args.turns_per_day, seed=1,
                          rebuild=False)
        print(f"generated {n:,} events in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        with db.engine.begin() as conn:
            turns = rebuild_team_turns(conn)
        print(f"rebuilt {turns:,} turns in {time.perf_counter() - t:.1f} s (the receiver "
              "does this per batch, for the people in it)")
        q = TeamQuery("telemetry", "person")
        total = 0.0
        with db.engine.connect() as conn:
            for f in (team_weekly, team_wait_bins, team_agents):
                t = time.perf_counter()
                rows = len(f(conn, q))
                dt = time.perf_counter() - t
                total += dt
                print(f"{f.__name__:15s} {rows:8,} rows  {dt:7.2f} s")
        print(f"first render (SQL part) {total:.2f} s; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        db.dispose()


if __name__ == "__main__":
    main()
