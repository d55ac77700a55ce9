"""The team view at scale: a generated year of an observe study (``simulate_team``: agent
telemetry only, a share of the people with ActivityWatch focus capture), then

- generation: events bulk-inserted (SQLite ``executemany``, PostgreSQL ``COPY``), time;
- turns and the weekly rollup rebuilt in bulk SQL (``rebuild_team_turns``), time; the
  database's size (``--db`` keeps the file; given again, it is reused and, if its schema is
  older, upgraded: the upgrade to schema 12 fills the rollup, timed);
- first render, in a fresh process (caches cold): the team page's three SQL aggregates,
  then the dashboard's first page (Overview) and the Team page (Streamlit ``AppTest``),
  each timed, and that process's peak RSS;
- incremental upkeep: batches of one person's next turn, written and their turns refreshed
  as the OTLP receiver does (``refresh_turns``: turns and rollup), median and p95 per batch;

beside the machine's load and a floor: one full scan of ``team_turns`` (the least any
aggregate over every turn costs on this machine now). ``--calls`` is the target number of
model calls (2.5 a turn on average); 25,000,000 is a year of a 500-person team.

    python benchmarks/bench_team_view.py [--calls 1000000] [--people 500] [--weeks 52]
        [--backend sqlite|postgresql] [--focus-share 0.2] [--db kept.db] [--generate-only]

Measured on a shared 2-vCPU machine (load 4–12; the full table, with the floor, is in
docs/operators/team-rollout.md#scale). With the weekly rollup the page's SQL is 1.8 s wall
at 1 M and at 5 M calls on SQLite (0.87 / 0.53 s CPU) while the floor grew 5× (0.20 →
1.02 s), 1.3 s on PostgreSQL at 5 M; Team page first render 2.4–5.0 s, peak RSS 325–340 MB
(SQLite and PostgreSQL, 1 M and 5 M calls). The choice: SQL on SQLite/PostgreSQL over the
rollup (its size is people × agents × models × weeks, not calls); DuckDB over the raw turns
was 7.5× faster than SQLite on the same scan but still grows with the calls, and needs a
second engine (same page).
The year (25 M calls, 54 M events, SQLite, load 3–8): turns and rollup rebuilt in
2,003 s wall / 832 s CPU; first render in a fresh process: page SQL 0.54 s wall / 0.48 s
CPU beside a floor of 1.29 s / 1.23 s, Team page 2.1 s, Overview 3.3 s, peak RSS 328 MB;
upkeep per batch 84 ms median, 100 ms p95.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

# Run as a script, benchmarks/ is on sys.path, not the repository: put it first.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OBSERVE = '[study]\nname = "bench"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'
APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
CALLS_PER_TURN = 2.5  # the generator draws 1–4 calls a turn


def load() -> str:
    avg = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"load avg {avg} on {os.cpu_count()} CPUs"


class Clock:
    """Wall and CPU seconds of this process since it was made: on a loaded machine the CPU
    is the steadier figure (SQLite works in-process; PostgreSQL's server CPU is not in it)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __str__(self) -> str:
        return (f"{time.perf_counter() - self.wall:6.2f} s wall, "
                f"{time.process_time() - self.cpu:6.2f} s CPU")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def render(url: str) -> dict[str, Any]:
    """First render in this (fresh) process: SQL aggregates, then the pages; peak RSS."""
    from sqlalchemy import text

    from flowtrial.analysis.team import TeamQuery, team_agents, team_wait_bins, team_weekly
    from flowtrial.study.storage import open_db

    db = open_db(url)
    out: dict[str, Any] = {"rss_imports_mb": rss_mb()}
    study = db.config().study  # the page's parameters: the rollup is built at these
    q = TeamQuery("telemetry", "person", idle_limit_s=study.idle_limit_s,
                  time_scale=study.time_scale, dialect=db.engine.dialect.name)
    with db.engine.connect() as conn:
        c = Clock()
        conn.execute(text("SELECT sum(wait_ns) FROM team_turns")).scalar()
        out["floor"] = str(c)
        out["rollup_rows"] = conn.execute(text("SELECT count(*) FROM team_weeks")).scalar()
        for f in (team_weekly, team_wait_bins, team_agents):
            c = Clock()
            rows = len(f(conn, q))
            out[f.__name__] = (str(c), rows)
    db.dispose()
    out["rss_sql_mb"] = rss_mb()
    os.environ["FLOWTRIAL_DASHBOARD_DB"] = url
    os.environ["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    c = Clock()
    import altair  # noqa: F401 - paid once per dashboard process, not per page
    from streamlit.testing.v1 import AppTest

    import flowtrial.dashboards.ui  # noqa: F401
    out["imports"] = str(c)
    at = AppTest.from_file(str(APP), default_timeout=1800)
    for page in ("pages/overview.py", "pages/team.py"):
        c = Clock()
        (at if page.endswith("overview.py") else at.switch_page(page)).run()
        out[page] = (str(c), len(at.exception) + len(at.error))
    out["rss_peak_mb"] = rss_mb()
    return out


def upkeep(url: str, batches: int, people: int) -> list[float]:
    """Seconds per batch: one person's next turn written, then their turns refreshed."""
    from sqlalchemy import text

    from flowtrial.instrumentation.telemetry.team import refresh_turns
    from flowtrial.study.simulator.team import COLUMNS, insert_events, team_events
    from flowtrial.study.storage import open_db

    db = open_db(url)
    times = []
    with db.engine.connect() as conn:
        last = int(conn.execute(text("SELECT max(ts_ns) FROM events")).scalar() or 0)
    fresh = list(team_events(people, 1, 1, seed=99, days_per_week=1, received=None))
    for i in range(batches):
        pid = f"t-{(i * 37) % people + 1:016x}"
        shift = last + (i + 1) * 60 * 10**9 - min(r[3] for r in fresh if r[0] == pid)
        rows = [(*r[:3], r[3] + shift, *r[4:7], f"bench:{i}:{r[7]}",
                 "2026-12-31 00:00:00.000000" if db.engine.dialect.name == "sqlite"
                 else datetime(2026, 12, 31))
                for r in fresh if r[0] == pid]
        t = time.perf_counter()
        with db.engine.begin() as conn:
            insert_events(conn, rows)
        refresh_turns(db, [dict(zip(COLUMNS, r, strict=True)) for r in rows])
        times.append(time.perf_counter() - t)
    db.dispose()
    return times


def size_mb(url: str, path: Path | None) -> float:
    if path is not None:
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20
    import sqlalchemy

    eng = sqlalchemy.create_engine(url)
    with eng.connect() as conn:
        n = conn.execute(sqlalchemy.text("SELECT pg_database_size(current_database())")).scalar()
    eng.dispose()
    return float(n or 0) / 2**20


def generate(url: str, path: Path | None, args: argparse.Namespace) -> None:
    """The generated year written into ``url``, then its turns rebuilt; each step timed."""
    from sqlalchemy import text

    from flowtrial.study.config import parse_study
    from flowtrial.study.simulator.team import simulate_team
    from flowtrial.study.storage import init_db
    from flowtrial.study.team_turns import rebuild_team_turns

    per_day = max(1, round(args.calls / (args.people * args.weeks * 5 * CALLS_PER_TURN)))
    print(f"{args.people} people × {args.weeks} weeks × {per_day} turns a working day, "
          f"{args.backend}; {load()}", flush=True)
    db = init_db(url, parse_study(tomllib.loads(OBSERVE)), OBSERVE)
    c = Clock()
    step = 5_000_000

    def progress(n: int) -> None:
        if n // step != (n - 200_000) // step:
            print(f"  {n:,} events, {c}; {load()}", flush=True)

    n = simulate_team(db, args.people, args.weeks, per_day, seed=1, rebuild=False,
                      focus_share=args.focus_share, defer_indexes=True, batch=200_000,
                      progress=progress)
    print(f"generated {n:,} events in {c} (indexes built after the load); "
          f"peak RSS {rss_mb():.0f} MB", flush=True)
    c = Clock()
    with db.engine.begin() as conn:
        turns = rebuild_team_turns(conn)
    with db.engine.connect() as conn:
        calls = conn.execute(text("SELECT sum(calls) FROM team_turns")).scalar()
    print(f"rebuilt {turns:,} turns ({int(calls or 0):,} model calls) "
          f"in bulk SQL in {c}; database {size_mb(url, path):,.0f} MB; {load()}", flush=True)
    db.dispose()


def measure(url: str, batches: int, people: int) -> None:
    """First render in a fresh process, then upkeep per batch."""
    out = json.loads(subprocess.run([sys.executable, __file__, "--render", url],
                                    capture_output=True, text=True, check=True
                                    ).stdout.splitlines()[-1])
    print(f"first render in a fresh process ({load()}):")
    print(f"  floor: one full scan of team_turns  {out['floor']}; "
          f"{out.get('rollup_rows', 0):,} rollup rows")
    print(f"  {'imports (once per process)':34s} {out.get('imports')}")
    for k in ("team_weekly", "team_wait_bins", "team_agents"):
        print(f"  {k:34s} {out[k][0]}  {out[k][1]:8,} rows")
    for k in ("pages/overview.py", "pages/team.py"):
        print(f"  {k:34s} {out[k][0]}  errors={out[k][1]}")
    print(f"  peak RSS: {out['rss_imports_mb']:.0f} MB after imports, "
          f"{out['rss_sql_mb']:.0f} MB after the SQL, {out['rss_peak_mb']:.0f} MB after "
          "the pages", flush=True)
    times = sorted(upkeep(url, batches, people))
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(f"upkeep per batch (one person's turn written + turns refreshed), "
          f"{len(times)} batches: median {statistics.median(times) * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms; {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=float, default=1e6)
    ap.add_argument("--people", type=int, default=500)
    ap.add_argument("--weeks", type=int, default=52)
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--focus-share", type=float, default=0.2)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--db", type=Path, help="SQLite file to keep: generated if absent, "
                    "else reused as it is (generation and rebuild skipped)")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--render", help=argparse.SUPPRESS)  # the fresh render process
    args = ap.parse_args()
    if args.render:
        print(json.dumps(render(args.render)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="team-bench-", dir="/tmp"))
    server = None
    try:
        path: Path | None = args.db or tmp / "team.db"
        url = str(path)
        if args.backend == "postgresql":
            from tests.pg_server import start_server

            server = start_server()
            url, path = server.new_database(), None
        if path is None or not path.exists():
            generate(url, path, args)
        else:
            from flowtrial.study.storage import open_db

            c = Clock()
            db = open_db(url)  # an older schema is upgraded here (the rollup filled)
            print(f"reused {path} ({size_mb(url, path):,.0f} MB), opened in {c}; {load()}",
                  flush=True)
            with db.engine.begin() as conn:  # a generation stopped before its turns
                if not conn.exec_driver_sql("SELECT 1 FROM team_turns LIMIT 1").first():
                    from flowtrial.study.team_turns import rebuild_team_turns

                    c = Clock()
                    n = rebuild_team_turns(conn)
                    print(f"rebuilt {n:,} turns and the rollup in {c}; {load()}", flush=True)
            db.dispose()
        if not args.generate_only:
            measure(url, args.batches, args.people)
    finally:
        if server is not None:
            server.remove()
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
