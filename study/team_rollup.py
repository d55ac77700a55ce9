"""The weekly rollup of a team study's turns (``team_weeks``, schema 12): per person, agent,
model and week (Monday, UTC), what the team view and the team analysis aggregate, so a year
of a 500-person team is read as ~80 k rows instead of ~10 M turns.

Columns (durations raw, × ``time_scale`` = real):

- ``turns``, ``calls``, ``decided``, ``accepted`` (the person's tool decisions), ``decide_s``;
- ``wait_ns``: the sum of the turns' waits; ``active_ns``: the sum of each turn's active
  time (the gap to the person's next turn, or just the wait when that gap exceeds the
  study's idle limit or the turn is the person's last);
- ``switches``: ``focus_out`` events inside the turns' waits; ``captured``: 1 when the person
  had any focus or AFK event that week (else switches are unmeasured: "—", not 0);
- ``w00`` … ``w10``: how many waits fall in each bin of :data:`WAIT_EDGES_S` (real seconds,
  converted at the study's time scale).

:func:`weekly_rows` is the one definition: the rollup is filled with it, and a query that the
rollup cannot answer (a date range cutting a week, another idle limit or time scale, the
proxy's waits) runs it over the raw rows instead. The rollup is kept up in the transaction
that rewrites a person's turns (:func:`refresh_rollup`, from the week of the first turn whose
row or gap changed) and after ActivityWatch imports (captures change switches).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, case, delete, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import Subquery
from sqlmodel import SQLModel

from .schema import WAIT_EDGES_S, Event, Meta, Study, TeamTurn, TeamWeek

__all__ = ["BIN_COLUMNS", "CAPTURE_KINDS", "ROLLUP_COLUMNS", "RollupParams", "WAIT_EDGES_S",
           "rebuild_rollup", "refresh_rollup", "rollup_params", "week_of", "week_start_ns",
           "weekly_rows"]

NS = 1_000_000_000
WEEK_NS = 7 * 86_400 * NS
MONDAY_SHIFT_NS = 3 * 86_400 * NS  # 1970-01-01 was a Thursday: +3 days makes weeks start Monday
CAPTURE_KINDS = ("focus_out", "focus_in", "afk_start", "afk_end")
BIN_COLUMNS = tuple(f"w{i:02d}" for i in range(len(WAIT_EDGES_S)))
ROLLUP_COLUMNS = ("pid", "agent", "model", "week", "turns", "calls", "wait_ns", "active_ns",
                  "decided", "accepted", "decide_s", "switches", "captured", *BIN_COLUMNS)
#: The ``meta`` key holding the parameters the rollup was built with.
PARAMS_KEY = "team_rollup"

_ = (Event, TeamTurn, TeamWeek, Meta, Study)  # their tables are registered by their models
EV_T = SQLModel.metadata.tables["events"]
TT_T = SQLModel.metadata.tables["team_turns"]
TW_T = SQLModel.metadata.tables["team_weeks"]
META_T = SQLModel.metadata.tables["meta"]
EV, TT, TW = EV_T.c, TT_T.c, TW_T.c


@dataclass(frozen=True)
class RollupParams:
    """What the rollup depends on beyond the turns: the study's time scale (the bins are in
    real seconds) and idle limit (active time)."""

    time_scale: float = 1.0
    idle_limit_s: float = 600.0


def week_of(ts: ColumnElement[Any]) -> ColumnElement[Any]:
    """The Monday-based week (since the epoch, UTC) of an epoch-ns column."""
    # // is integer division on both backends (CAST(x / y AS INTEGER) rounds on PostgreSQL).
    return (ts + MONDAY_SHIFT_NS) // WEEK_NS


def week_index(ts_ns: int) -> int:
    """:func:`week_of` for a number."""
    return (ts_ns + MONDAY_SHIFT_NS) // WEEK_NS


def week_start_ns(week: int) -> int:
    """The epoch ns of week ``week``'s Monday 00:00 UTC."""
    return week * WEEK_NS - MONDAY_SHIFT_NS


def _study_params(conn: Connection) -> RollupParams:
    row = conn.execute(select(Study.__table__.c.time_scale,  # type: ignore[attr-defined]
                              Study.__table__.c.config_json)).first()  # type: ignore[attr-defined]
    if row is None:
        return RollupParams()
    idle = json.loads(row[1]).get("study", {}).get("idle_limit_s", RollupParams.idle_limit_s)
    return RollupParams(float(row[0]), float(idle))


def rollup_params(conn: Connection) -> RollupParams | None:
    """The parameters the stored rollup was built with (None: never built)."""
    v = conn.execute(select(META_T.c.value).where(META_T.c.key == PARAMS_KEY)).scalar()
    return None if v is None else RollupParams(**json.loads(v))


def _store_params(conn: Connection, p: RollupParams) -> None:
    conn.execute(delete(META_T).where(META_T.c.key == PARAMS_KEY))
    conn.execute(META_T.insert().values(key=PARAMS_KEY, value=json.dumps(
        {"time_scale": p.time_scale, "idle_limit_s": p.idle_limit_s})))


def turn_rows(*where: ColumnElement[bool]) -> Subquery:
    """The stored turns in the shape :func:`weekly_rows` reads."""
    return (select(TT.participant_id.label("pid"), TT.agent, TT.model, TT.start_ns, TT.end_ns,
                   TT.wait_ns, TT.calls, TT.decided, TT.accepted, TT.decide_s, TT.gap_ns)
            .where(*where).subquery())


def weekly_rows(conn: Connection, w: Subquery, p: RollupParams,
                capture_where: list[ColumnElement[bool]]) -> Select[Any]:
    """Per (person, agent, model, week) of the waits ``w`` (columns ``pid, agent, model,
    start_ns, end_ns, wait_ns, calls, decided, accepted, decide_s, gap_ns``): the rollup's
    :data:`ROLLUP_COLUMNS`. ``capture_where`` narrows the focus/AFK events read for
    ``captured`` (to the people and weeks of ``w``: the result is the same, the scan shorter)."""
    limit_raw = p.idle_limit_s / p.time_scale * NS
    active = case((and_(w.c.gap_ns.is_not(None), w.c.gap_ns <= limit_raw), w.c.gap_ns),
                  else_=w.c.wait_ns)
    week = week_of(w.c.start_ns)
    keys = (w.c.pid, w.c.agent, w.c.model, week)
    edges = [e / p.time_scale * NS for e in WAIT_EDGES_S]
    bins = []
    for i in range(len(edges)):
        parts = ([w.c.wait_ns >= edges[i]] if i else []) + (
            [w.c.wait_ns < edges[i + 1]] if i + 1 < len(edges) else [])
        bins.append(func.sum(case((and_(*parts), 1), else_=0)).label(BIN_COLUMNS[i]))
    main = (select(*[k.label(n) for k, n in zip(keys, ROLLUP_COLUMNS, strict=False)],
                   func.count().label("turns"), func.sum(w.c.calls).label("calls"),
                   func.sum(w.c.wait_ns).label("wait_ns"), func.sum(active).label("active_ns"),
                   func.sum(w.c.decided).label("decided"),
                   func.sum(w.c.accepted).label("accepted"),
                   func.sum(w.c.decide_s).label("decide_s"), *bins)
            .group_by(*keys).subquery())
    # Switches: focus_out events inside a wait. A wait holding one starts at most the longest
    # wait before it, which bounds each lookup to a short index range of (participant, ts).
    longest = int(conn.execute(select(func.max(w.c.end_ns - w.c.start_ns))).scalar() or 0)
    sw = (select(*[k.label(n) for k, n in zip(keys, ("spid", "sagent", "smodel", "sweek"),
                                                strict=True)], func.count(EV.id).label("n"))
          .select_from(w.join(EV_T, and_(EV.participant_id == w.c.pid,
                                         EV.ts_ns >= w.c.start_ns, EV.ts_ns <= w.c.end_ns,
                                         w.c.start_ns >= EV.ts_ns - longest)))
          .where(EV.kind == "focus_out").group_by(*keys).subquery())
    cap_week = week_of(EV.ts_ns)  # one object: PostgreSQL matches GROUP BY by its parameters
    cap = (select(EV.participant_id.label("cpid"), cap_week.label("cweek"))
           .where(EV.kind.in_(CAPTURE_KINDS), *capture_where)
           .group_by(EV.participant_id, cap_week).subquery())
    on_sw = and_(sw.c.spid == main.c.pid, sw.c.sagent == main.c.agent,
                 sw.c.smodel == main.c.model, sw.c.sweek == main.c.week)
    return (select(*[main.c[n] for n in ROLLUP_COLUMNS[:11]],
                   func.coalesce(sw.c.n, 0).label("switches"),
                   case((cap.c.cpid.is_not(None), 1), else_=0).label("captured"),
                   *[main.c[n] for n in BIN_COLUMNS])
            .select_from(main.outerjoin(sw, on_sw).outerjoin(
                cap, and_(cap.c.cpid == main.c.pid, cap.c.cweek == main.c.week))))


def _fill(conn: Connection, p: RollupParams, pid: str, first_week: int) -> None:
    """Write ``pid``'s rollup rows from ``first_week`` on (the rows there deleted first)."""
    lo = week_start_ns(first_week)
    conn.execute(delete(TW_T).where(TW.participant_id == pid, TW.week >= first_week))
    rows = weekly_rows(conn, turn_rows(TT.participant_id == pid, TT.start_ns >= lo), p,
                       [EV.participant_id == pid, EV.ts_ns >= lo])
    cols = ["participant_id", *ROLLUP_COLUMNS[1:]]
    conn.execute(TW_T.insert().from_select(cols, rows))


def refresh_rollup(conn: Connection, pid: str, since_ns: int) -> None:
    """Bring ``pid``'s rollup up to date from the week of ``since_ns`` on (the earliest turn
    whose row, gap or captures changed), at the parameters it was built with (built first
    if it never was)."""
    p = rollup_params(conn)
    if p is None:
        rebuild_rollup(conn)
        return
    _fill(conn, p, pid, week_index(since_ns))


def rebuild_rollup(conn: Connection) -> int:
    """The whole rollup from ``team_turns``, at the study's current time scale and idle limit;
    one statement per person (an index range each). Returns the rows written."""
    p = _study_params(conn)
    _store_params(conn, p)
    conn.execute(delete(TW_T))
    for pid in conn.execute(select(TT.participant_id).distinct()).scalars().all():
        _fill(conn, p, str(pid), week_index(0))
    return int(conn.execute(select(func.count()).select_from(TW_T)).scalar_one())


def rollup_select(*where: ColumnElement[bool]) -> Select[Any]:
    """Stored rollup rows in :data:`ROLLUP_COLUMNS` order."""
    return select(TW.participant_id.label("pid"),
                  *[TW[n] for n in ROLLUP_COLUMNS[1:]]).where(*where)

