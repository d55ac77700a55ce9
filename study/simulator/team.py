"""A generated team for the team view's tests and benchmark: ``people`` people over
``weeks`` weeks, each turn written as the agent-telemetry events the OTLP receiver stores
(``turn_start``, ``api_request`` per model call, ``tool_result`` between them, and now and
then a person's tool decision), under pseudonyms as in an ``observe`` study.

Waits are log-normal per person (some people wait far more than others), working days
Monday to Friday, turns a few minutes apart; a fixed seed gives the same team.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np

from ..schema import Event
from ..storage import Database, WriteBatch, utcnow, write_rows
from ..team import ensure_members
from ..team_turns import rebuild_team_turns

__all__ = ["simulate_team"]

NS = 1_000_000_000
MONDAY_2026 = 1_767_571_200 * NS  # 2026-01-05 00:00 UTC, a Monday
AGENTS = (("claude_code", "claude-sonnet-4"), ("codex", "gpt-5"), ("gemini_cli", "gemini-2.5"))


def _turns(rng: np.random.Generator, pid: str, agent: str, model: str, t0: int,
           median_wait_s: float, received: datetime) -> Iterator[dict[str, Any]]:
    calls = int(rng.integers(1, 5))
    wait = float(rng.lognormal(np.log(median_wait_s), 0.8))
    base = {"participant_id": pid, "source": "otel", "received_at": received,
            "cycle_id": None}

    def row(kind: str, ts: int, dur: float | None, **payload: Any) -> dict[str, Any]:
        key = f"otel:{pid}:{t0}:{kind}:{ts}"
        return {**base, "kind": kind, "ts_ns": ts, "duration_s": dur, "dedupe_key": key,
                "payload_json": json.dumps({"agent": agent, **payload})}

    yield row("turn_start", t0, None, prompt_length=20)
    step = wait / calls
    for i in range(calls):
        end = t0 + round((i + 1) * step * NS)
        yield row("api_request", end, step * 0.8, model=model)
        if i < calls - 1:
            yield row("tool_result", end + round(step * 0.1 * NS), step * 0.1, tool="Bash")
    if rng.random() < 0.3:
        kind = "accept" if rng.random() < 0.8 else "reject"
        yield row(kind, t0 + round(wait * 0.5 * NS), None, decided_by="person")


def simulate_team(db: Database, people: int, weeks: int, turns_per_day: int = 2,
                  seed: int = 0, batch: int = 50_000, days_per_week: int = 5,
                  rebuild: bool = True) -> int:
    """Write the generated team into ``db`` (an observe study); returns the events written."""
    rng = np.random.default_rng(seed)
    pids = [f"t-{i:016x}" for i in range(1, people + 1)]
    ensure_members(db, dict.fromkeys(pids))
    received = utcnow()
    medians = rng.lognormal(np.log(15.0), 0.6, people)
    rows: list[dict[str, Any]] = []
    n = 0
    for w in range(weeks):
        for p, pid in enumerate(pids):
            agent, model = AGENTS[p % len(AGENTS)]
            for d in range(days_per_week):
                day = MONDAY_2026 + (w * 7 + d) * 86_400 * NS + 9 * 3600 * NS
                starts = np.sort(rng.uniform(0, 8 * 3600, turns_per_day))
                for s in starts:
                    rows.extend(_turns(rng, pid, agent, model, day + round(s * NS),
                                       float(medians[p]), received))
            if len(rows) >= batch:
                write_rows(db, [WriteBatch(Event, rows)])
                n += len(rows)
                rows = []
    if rows:
        write_rows(db, [WriteBatch(Event, rows)])
        n += len(rows)
    if rebuild:
        with db.engine.begin() as conn:  # what the receiver does batch by batch
            rebuild_team_turns(conn)
    return n
