"""A generated team for the team view's tests and benchmark: ``people`` people over
``weeks`` weeks, each turn written as the agent-telemetry events the OTLP receiver stores
(``turn_start``, ``api_request`` per model call, ``tool_result`` between them, and now and
then a person's tool decision), under pseudonyms as in an ``observe`` study; optionally
ActivityWatch focus events (a switch away during some waits) for a share of the people.

Waits are log-normal per person (some people wait far more than others), working days
Monday to Friday, a day's turns one after another from 9:00; a fixed seed gives the same
team. Rows are bulk-inserted in chunks (SQLite ``executemany``, PostgreSQL ``COPY``), so a
year of a large team is written in bounded memory at the database's own speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

from ..schema import Event
from ..storage import Database, utcnow
from ..team import ensure_members
from ..team_turns import rebuild_team_turns

__all__ = ["AGENTS", "insert_events", "simulate_team", "team_events"]

NS = 1_000_000_000
DAY_NS = 86_400 * NS
MONDAY_2026 = 1_767_571_200 * NS  # 2026-01-05 00:00 UTC, a Monday
AGENTS = (("claude_code", "claude-sonnet-4"), ("codex", "gpt-5"), ("gemini_cli", "gemini-2.5"))
#: The events table's columns the generator fills (``id`` is the database's).
COLUMNS = ("participant_id", "cycle_id", "kind", "ts_ns", "duration_s", "source",
           "payload_json", "dedupe_key", "received_at")
Row = tuple[Any, ...]
EVENTS = SQLModel.metadata.tables[str(Event.__tablename__)]


def _payloads(agent: str, model: str) -> dict[str, str]:
    # Constant per agent: the JSON the receiver stores, built once, not per row.
    a = f'{{"agent": "{agent}"'
    return {"turn_start": a + ', "prompt_length": 20}',
            "api_request": a + f', "model": "{model}"}}',
            "tool_result": a + ', "tool": "Bash"}',
            "decision": a + ', "decided_by": "person"}'}


def _person_week(rng: np.random.Generator, pid: str, agent: int, week: int, per_day: int,
                 days: int, median_wait_s: float, focus: bool,
                 received: Any) -> Iterator[Row]:
    """One person's week of turns, as event rows."""
    pay = _payloads(*AGENTS[agent])
    n = days * per_day
    calls = rng.integers(1, 5, n)
    waits = rng.lognormal(np.log(median_wait_s), 0.8, n)
    # Time between one turn's answer and the next prompt: a working day holds the turns.
    think = rng.exponential(max(8 * 3600 / per_day - median_wait_s, 5.0), n)
    decide = rng.random(n)
    away = rng.random(n) if focus else np.ones(n)
    for d in range(days):
        t = MONDAY_2026 + (week * 7 + d) * DAY_NS + 9 * 3600 * NS
        for i in range(d * per_day, (d + 1) * per_day):
            t += round(float(think[i]) * NS)
            wait = float(waits[i])
            key = f"otel:{pid}:{t}:"
            yield (pid, None, "turn_start", t, None, "otel", pay["turn_start"], key + "p",
                   received)
            step = wait / int(calls[i])
            for c in range(int(calls[i])):
                end = t + round((c + 1) * step * NS)
                yield (pid, None, "api_request", end, step * 0.8, "otel", pay["api_request"],
                       f"{key}c{c}", received)
                if c < calls[i] - 1:
                    yield (pid, None, "tool_result", end + round(step * 0.1 * NS), step * 0.1,
                           "otel", pay["tool_result"], f"{key}t{c}", received)
            if decide[i] < 0.3:
                kind = "accept" if decide[i] < 0.24 else "reject"
                yield (pid, None, kind, t + round(wait * 0.5 * NS), None, "otel",
                       pay["decision"], key + "d", received)
            if away[i] < 0.3:  # switched away during this wait, back before its end
                out = t + round(wait * 0.3 * NS)
                yield (pid, None, "focus_out", out, None, "activitywatch", None, key + "o",
                       received)
                yield (pid, None, "focus_in", out + round(wait * 0.4 * NS), None,
                       "activitywatch", None, key + "i", received)
            t += round(wait * NS)


def team_events(people: int, weeks: int, turns_per_day: int = 2, seed: int = 0,
                days_per_week: int = 5, focus_share: float = 0.0,
                received: Any = None) -> Iterator[Row]:
    """The generated team's event rows (``COLUMNS``), week by week, person by person."""
    rng = np.random.default_rng(seed)
    pids = [f"t-{i:016x}" for i in range(1, people + 1)]
    medians = rng.lognormal(np.log(15.0), 0.6, people)
    focused = rng.random(people) < focus_share
    for w in range(weeks):
        for p, pid in enumerate(pids):
            yield from _person_week(rng, pid, p % len(AGENTS), w, turns_per_day,
                                    days_per_week, float(medians[p]), bool(focused[p]),
                                    received)


def insert_events(conn: Connection, rows: list[Row]) -> None:
    """Bulk-insert event rows (``COLUMNS``): PostgreSQL ``COPY``, else one prepared
    ``executemany`` (SQLite)."""
    if not rows:
        return
    names = ", ".join(COLUMNS)
    if conn.dialect.name == "postgresql":
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy(f"COPY events ({names}) FROM STDIN") as cp:
            for r in rows:
                cp.write_row(r)
        return
    marks = ", ".join("?" * len(COLUMNS))
    conn.exec_driver_sql(f"INSERT INTO events ({names}) VALUES ({marks})", rows)


def _received(db: Database) -> Any:
    now: datetime = utcnow()
    if db.engine.dialect.name == "sqlite":  # SQLAlchemy's own DateTime text on SQLite
        return now.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    return now


def simulate_team(db: Database, people: int, weeks: int, turns_per_day: int = 2,
                  seed: int = 0, batch: int = 50_000, days_per_week: int = 5,
                  rebuild: bool = True, focus_share: float = 0.0,
                  defer_indexes: bool = False,
                  progress: Callable[[int], None] | None = None) -> int:
    """Write the generated team into ``db`` (an observe study); returns the events written.
    ``rebuild`` then builds every turn in bulk SQL (the receiver does it batch by batch).
    ``defer_indexes`` drops the events' secondary indexes for the load and builds them
    after it (one sort each instead of millions of B-tree inserts: a generated year).
    ``progress`` is called with the events written so far after each chunk."""
    ensure_members(db, dict.fromkeys(f"t-{i:016x}" for i in range(1, people + 1)))
    indexes = list(EVENTS.indexes) if defer_indexes else []
    with db.engine.begin() as conn:
        for ix in indexes:
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {ix.name}")
    rows: list[Row] = []
    n = 0
    for r in team_events(people, weeks, turns_per_day, seed, days_per_week, focus_share,
                         _received(db)):
        rows.append(r)
        if len(rows) >= batch:
            with db.engine.begin() as conn:
                insert_events(conn, rows)
            n += len(rows)
            rows = []
            if progress is not None:
                progress(n)
    with db.engine.begin() as conn:
        insert_events(conn, rows)
        for ix in indexes:
            ix.create(conn)
        if rebuild:
            rebuild_team_turns(conn)
    return n + len(rows)
