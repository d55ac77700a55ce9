"""Team analysis in the database: per week and person, agent or model, the waits per turn,
the share of working time spent waiting, switches during waits and decisions.

Every aggregate is one SQL query (SQLAlchemy Core: SQLite ≥ 3.25 and PostgreSQL), so a
year of a large team is never loaded row by row into pandas; what comes back has one row
per (group, week) or per (week, histogram bin).

Two sources of waits, same columns (:func:`waits_query`):

- ``proxy``: one wait per cycle the proxy recorded (request → last token sent);
- ``telemetry``: one wait per agent turn rebuilt from the agents' own telemetry alone, for a
  team with no proxy in the path (``design = "observe"``): the ``team_turns`` rows the
  receiver keeps up to date (``flowtrial.study.team_turns`` defines a turn and its wait).

:func:`reconcile` sets telemetry turns beside the proxy's turns where a study has both.

"Unmeasured is never zero": a (group, week) with no focus capture has ``switches = NaN``
(``switch_reason`` says why), one without decisions ``acceptance_rate = NaN``.
Durations are raw in the database; callers pass the study's ``time_scale``.

The weekly view, the wait bins and the agents table aggregate per (person, agent, model,
week) rows (:func:`rollup_rows`): for telemetry, the stored weekly rollup
(``flowtrial.study.team_rollup``: ~80 k rows for a year of 500 people), with the raw turns
read only for a week the date range cuts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
from sqlalchemy import Select, Table, and_, case, func, literal, select, union_all
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import Subquery
from sqlmodel import SQLModel

from flowtrial.study.schema import Cycle, Event, TeamTurn, TeamWeek, Turn
from flowtrial.study.team_rollup import (
    BIN_COLUMNS,
    MONDAY_SHIFT_NS,
    NS,
    WAIT_EDGES_S,
    WEEK_NS,
    RollupParams,
    rollup_params,
    rollup_select,
    week_index,
    week_start_ns,
    weekly_rows,
)
from flowtrial.study.team_turns import person_decision, telemetry_turns

__all__ = [
    "DECISION_KINDS",
    "MATCH_TOLERANCE_S",
    "WAIT_EDGES_S",
    "TeamQuery",
    "reconcile",
    "team_agents",
    "team_wait_bins",
    "team_weekly",
    "wait_source",
    "waits_query",
]

Source = Literal["proxy", "telemetry"]
Group = Literal["person", "agent", "model"]
DECISION_KINDS = ("accept", "reject", "partial_accept")


def _table(model: type[SQLModel]) -> Table:
    return SQLModel.metadata.tables[str(model.__tablename__)]


CYCLE_T, EVENT_T, TURN_T = _table(Cycle), _table(Event), _table(Turn)
CY, EV, TU, TT = CYCLE_T.c, EVENT_T.c, TURN_T.c, _table(TeamTurn).c
TW = _table(TeamWeek).c


@dataclass(frozen=True)
class TeamQuery:
    """What to aggregate: the source, the grouping, the idle limit and the filters
    (UTC epoch ns bounds, participant ids; empty = all). Hashable: a cache key."""

    source: Source
    by: Group = "person"
    idle_limit_s: float = 300.0
    time_scale: float = 1.0
    start_ns: int | None = None
    end_ns: int | None = None
    participants: tuple[str, ...] = ()
    dialect: str = "sqlite"


def wait_source(design: str) -> Source:
    """``telemetry`` for an observe study (no proxy), else ``proxy``."""
    return "telemetry" if design == "observe" else "proxy"


def _proxy_waits(q: TeamQuery) -> Select[Any]:
    start = CY.wall_anchor_ns + (CY.t_request_ns - CY.mono_anchor_ns)
    end = CY.wall_anchor_ns + (func.coalesce(CY.t_last_sent_ns, CY.t_request_ns)
                               - CY.mono_anchor_ns)
    dec = (select(EV.cycle_id.label("cid"), func.count().label("decided"),
                  func.sum(case((EV.kind == "accept", 1), else_=0)).label("accepted"))
           .where(EV.kind.in_(DECISION_KINDS), EV.cycle_id.is_not(None), person_decision())
           .group_by(EV.cycle_id).subquery())
    return (select(CY.participant_id.label("pid"),
                   func.coalesce(CY.client, "unknown").label("agent"),
                   func.coalesce(CY.model, "unknown").label("model"),
                   start.label("start_ns"), end.label("end_ns"),
                   (end - start).label("wait_ns"), literal(1).label("calls"),
                   func.coalesce(dec.c.decided, 0).label("decided"),
                   func.coalesce(dec.c.accepted, 0).label("accepted"),
                   literal(0.0).label("decide_s"), start.label("first_call_ns"))
            .select_from(CYCLE_T.outerjoin(dec, dec.c.cid == CY.id))
            .where(CY.status == "ok"))


def _telemetry_rows() -> Any:
    """The stored telemetry turns (``team_turns``: refreshed by the receiver as batches
    arrive, each with its gap to the person's next turn)."""
    return select(TT.participant_id.label("pid"), TT.agent, TT.model, TT.start_ns, TT.end_ns,
                  TT.wait_ns, TT.calls, TT.decided, TT.accepted, TT.decide_s,
                  TT.first_call_ns, TT.gap_ns).subquery().c


def _proxy_rows(q: TeamQuery) -> Any:
    inner = _proxy_waits(q).subquery()
    gap = func.lead(inner.c.start_ns).over(partition_by=inner.c.pid,
                                           order_by=inner.c.start_ns) - inner.c.start_ns
    # Filter after the window: the gap to the next wait needs every wait of the person.
    return select(*inner.c, gap.label("gap_ns")).subquery().c


def waits_query(q: TeamQuery) -> Subquery:
    """One row per wait: ``pid, agent, model, start_ns, end_ns, wait_ns`` (raw), ``calls``,
    ``decided, accepted`` (the person's tool decisions), ``decide_s``, ``first_call_ns`` (the
    first model request's start: the prompt is earlier by the agent's preparation), and
    ``gap_ns`` to the
    person's next wait (NULL for the last), filtered by time and participant."""
    fc = _telemetry_rows() if q.source == "telemetry" else _proxy_rows(q)
    where: list[ColumnElement[bool]] = []
    if q.participants:
        where.append(fc.pid.in_(q.participants))
    if q.start_ns is not None:
        where.append(fc.start_ns >= q.start_ns)
    if q.end_ns is not None:
        where.append(fc.start_ns < q.end_ns)
    return select(*fc).where(*where).subquery()


def _who(r: Subquery, by: Group) -> ColumnElement[Any]:
    return {"person": r.c.pid, "agent": r.c.agent, "model": r.c.model}[by]


def week_label(week: pd.Series) -> pd.Series:
    """Week numbers (Monday-based, since the epoch) as the ISO date of their Monday."""
    return pd.to_datetime(week.astype("int64") * WEEK_NS - MONDAY_SHIFT_NS, unit="ns",
                          utc=True).dt.strftime("%Y-%m-%d")


def _params(q: TeamQuery) -> RollupParams:
    return RollupParams(float(q.time_scale), float(q.idle_limit_s))


def _raw_part(conn: Any, q: TeamQuery,
              edge: Callable[[Subquery], ColumnElement[bool]] | None = None) -> Select[Any]:
    """:func:`weekly_rows` over the raw waits of ``q`` (those meeting ``edge``)."""
    w = waits_query(q)
    if edge is not None:
        w = select(*w.c).where(edge(w)).subquery()
    cap: list[ColumnElement[bool]] = []
    if q.participants:
        cap.append(EV.participant_id.in_(q.participants))
    if q.start_ns is not None:  # captures of the weeks the range touches, whole
        cap.append(EV.ts_ns >= week_start_ns(week_index(q.start_ns)))
    if q.end_ns is not None:
        cap.append(EV.ts_ns < week_start_ns(week_index(q.end_ns - 1) + 1))
    return weekly_rows(conn, w, _params(q), cap)


def rollup_rows(conn: Any, q: TeamQuery) -> Subquery:
    """Per (person, agent, model, week) in ``q``'s range: ``ROLLUP_COLUMNS``. A telemetry
    query at the parameters the stored rollup was built with reads ``team_weeks`` for the
    whole weeks of its range and the raw turns only for a week the range cuts; anything else
    (the proxy's waits, another idle limit or time scale) aggregates the raw rows with the
    same :func:`weekly_rows`."""
    if q.source != "telemetry" or rollup_params(conn) != _params(q):
        return _raw_part(conn, q).subquery()
    first = week_index(q.start_ns - 1) + 1 if q.start_ns is not None else None
    last = week_index(q.end_ns) - 1 if q.end_ns is not None else None  # whole weeks: first…last
    where: list[ColumnElement[bool]] = []
    if q.participants:
        where.append(TW.participant_id.in_(q.participants))
    if first is not None:
        where.append(TW.week >= first)
    if last is not None:
        where.append(TW.week <= last)
    parts = [rollup_select(*where)]
    if first is not None and (last is None or first <= last):
        parts.append(_raw_part(conn, q, lambda w: w.c.start_ns < week_start_ns(first)))
    if last is not None and (first is None or first <= last):
        parts.append(_raw_part(conn, q, lambda w: w.c.start_ns >= week_start_ns(last + 1)))
    if first is not None and last is not None and first > last:  # within one week
        parts = [_raw_part(conn, q)]
    return union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()


def team_weekly(conn: Any, q: TeamQuery) -> pd.DataFrame:
    """Per week (Monday, UTC) and group: ``waits``, ``people``, ``hours_active``,
    ``waiting_share``, ``mean_wait_s``, ``switches`` (focus_out during waits, NaN with
    ``switch_reason`` where no focus capture), ``switches_per_hour``, ``decided``,
    ``acceptance_rate`` (NaN with ``acceptance_reason`` where no decisions), ``decide_s``.

    Active time of a wait is the time to the same person's next one, or just the wait when
    that gap exceeds the idle limit (the person stopped working)."""
    r = rollup_rows(conn, q)
    who = _who(r, q.by)
    captured = func.count(case((r.c.captured == 1, r.c.pid), else_=None).distinct())
    rows = conn.execute(
        select(who, r.c.week, func.sum(r.c.turns), func.count(r.c.pid.distinct()),
               func.sum(r.c.wait_ns), func.sum(r.c.active_ns), func.sum(r.c.decided),
               func.sum(r.c.accepted), func.sum(r.c.decide_s), func.sum(r.c.calls),
               func.sum(r.c.switches), captured)
        .group_by(who, r.c.week))
    cols = ["who", "week", "waits", "people", "wait_ns", "active_ns", "decided", "accepted",
            "decide_s", "calls", "switches", "people_captured"]
    return _weekly_frame(pd.DataFrame([tuple(x) for x in rows], columns=cols), q.time_scale)


WEEKLY_COLUMNS = ["week", "who", "waits", "people", "calls", "hours_active", "waiting_share",
                  "mean_wait_s", "switches", "switches_per_hour", "switch_reason", "decided",
                  "acceptance_rate", "acceptance_reason", "decide_s"]


def _weekly_frame(df: pd.DataFrame, scale: float) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=WEEKLY_COLUMNS)
    for c in ("wait_ns", "active_ns", "decided", "accepted", "decide_s", "switches",
              "people_captured", "calls", "waits"):
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0.0).astype(float)
    wait_s = df["wait_ns"] / NS * scale
    active_s = df["active_ns"] / NS * scale
    hours = active_s / 3600.0
    has_capture = df["people_captured"] > 0
    switches = df["switches"].where(has_capture)
    out = pd.DataFrame({
        "week": week_label(df["week"]), "who": df["who"].astype(str),
        "waits": df["waits"].astype(int), "people": df["people"].astype(int),
        "calls": df["calls"].astype(int), "hours_active": hours,
        "waiting_share": (wait_s / active_s).where(active_s > 0),
        "mean_wait_s": wait_s / df["waits"],
        "switches": switches,
        "switches_per_hour": (switches / hours).where(hours > 0),
        "switch_reason": has_capture.map({True: "", False: "no focus capture"}),
        "decided": df["decided"].astype(int),
        "acceptance_rate": (df["accepted"] / df["decided"]).where(df["decided"] > 0),
        "acceptance_reason": (df["decided"] > 0).map({True: "", False: "no decisions"}),
        "decide_s": df["decide_s"] * scale,
    })
    return out.sort_values(["week", "who"], ignore_index=True)[WEEKLY_COLUMNS]


def team_wait_bins(conn: Any, q: TeamQuery) -> pd.DataFrame:
    """Per week and wait bin (``WAIT_EDGES_S``, real seconds): how many waits — the
    distribution of waits per turn, whatever the team's size (bins with none left out)."""
    r = rollup_rows(conn, q)
    rows = conn.execute(select(r.c.week, *[func.sum(r.c[b]) for b in BIN_COLUMNS])
                        .group_by(r.c.week))
    df = pd.DataFrame([tuple(x) for x in rows], columns=["week", *range(len(BIN_COLUMNS))])
    df = df.melt(id_vars="week", var_name="bin", value_name="waits")
    df["waits"] = pd.to_numeric(df["waits"]).fillna(0).astype(int)
    df = df[df["waits"] > 0]
    if df.empty:
        return pd.DataFrame(columns=["week", "bin", "range_s", "waits"])
    df["week"] = week_label(df["week"])
    df["bin"] = df["bin"].astype(int)
    df["range_s"] = [bin_label(i) for i in df["bin"]]
    return df.sort_values(["week", "bin"], ignore_index=True)[["week", "bin", "range_s",
                                                                "waits"]]


def bin_label(i: int) -> str:
    e = WAIT_EDGES_S
    return f"≥ {e[-1]:g} s" if i >= len(e) - 1 else f"{e[i]:g}–{e[i + 1]:g} s"


def team_agents(conn: Any, q: TeamQuery) -> pd.DataFrame:
    """Per agent and model over the whole range: waits, people, mean wait (real s),
    acceptance — an observational comparison (people chose their tools), with its sizes."""
    r = rollup_rows(conn, q)
    rows = conn.execute(
        select(r.c.agent, r.c.model, func.sum(r.c.turns), func.count(r.c.pid.distinct()),
               func.sum(r.c.wait_ns), func.sum(r.c.decided), func.sum(r.c.accepted))
        .group_by(r.c.agent, r.c.model).order_by(r.c.agent, r.c.model))
    df = pd.DataFrame([tuple(x) for x in rows], columns=[
        "agent", "model", "waits", "people", "wait_ns", "decided", "accepted"])
    df["waits"] = pd.to_numeric(df["waits"]).astype(int)
    df["mean_wait_s"] = (pd.to_numeric(df.pop("wait_ns")).astype(float) / df["waits"]
                         / NS * q.time_scale)
    dec = pd.to_numeric(df["decided"]).fillna(0).astype(float)
    df["acceptance_rate"] = (pd.to_numeric(df.pop("accepted")).astype(float) / dec
                             ).where(dec > 0)
    return df


#: A telemetry turn's first model request and the proxy's turn start (same machine: ms apart).
MATCH_TOLERANCE_S = 2.0
RECONCILE_COLUMNS = ["pid", "agent", "prompt_ns", "telemetry_wait_s", "telemetry_span_s",
                     "proxy_turn_id", "proxy_wait_s", "diff_s", "wait_s"]


def reconcile(conn: Any, q: TeamQuery) -> pd.DataFrame:
    """Telemetry turns beside the proxy's turns, where both exist (one study with the proxy
    in the path *and* the agents' telemetry). Per telemetry turn (computed from the events,
    filtered by ``q``'s participants and time range on the turn's start): its wait (prompt → final
    answer), its span (first request's start → final answer: what the proxy can see), the
    proxy turn it matches (same person, the proxy's start within :data:`MATCH_TOLERANCE_S`
    of the first request's start; each proxy turn once), the proxy's wait, ``diff_s`` =
    span − proxy wait, and ``wait_s``: the proxy's when matched (its clock is the one that
    shaped the wait), else the telemetry's. Real seconds.

    The database builds the turns and pairs each with its candidates (one join on person and
    tolerance); only those pairs come back, and the one-to-one choice among them is made here."""
    # From the events (in SQL), not team_turns: a study with the proxy keeps no team_turns.
    e = telemetry_turns(q.dialect, q.participants).subquery()
    tel = select(e.c.pid, e.c.agent, e.c.start_ns, e.c.first_call_ns, e.c.end_ns, e.c.wait_ns)
    if q.start_ns is not None:
        tel = tel.where(e.c.start_ns >= q.start_ns)
    if q.end_ns is not None:
        tel = tel.where(e.c.start_ns < q.end_ns)
    t = tel.subquery()
    start = TU.wall_anchor_ns + (TU.t_start_ns - TU.mono_anchor_ns)
    p = (select(TU.id, TU.participant_id.label("ppid"), start.label("pstart"), TU.wait_ms)
         .where(TU.wait_ms.is_not(None)).subquery())
    tol = int(MATCH_TOLERANCE_S * NS)
    near = and_(p.c.ppid == t.c.pid, p.c.pstart >= t.c.first_call_ns - tol,
                p.c.pstart <= t.c.first_call_ns + tol)
    rows = conn.execute(select(*t.c, p.c.id, p.c.pstart, p.c.wait_ms)
                        .select_from(t.outerjoin(p, near))
                        .order_by(t.c.pid, t.c.start_ns, t.c.agent))
    return pd.DataFrame(_pair(rows, q.time_scale), columns=RECONCILE_COLUMNS)


def _pair(rows: Any, scale: float) -> list[tuple[Any, ...]]:
    """One row per telemetry turn: the nearest proxy turn not yet taken, in time order."""
    out: list[tuple[Any, ...]] = []
    taken: set[str] = set()
    turn: tuple[Any, ...] | None = None
    cands: list[tuple[float, str, float]] = []

    def close() -> None:
        if turn is None:
            return
        pid, agent, prompt, first, end, wait = turn
        free = [c for c in cands if c[1] not in taken]
        match = min(free) if free else None
        if match is not None:
            taken.add(match[1])
        span = (end - first) / NS * scale if first is not None else float("nan")
        proxy = match[2] / 1000 * scale if match is not None else None
        tel_wait = float(wait) / NS * scale
        out.append((pid, agent, int(prompt), tel_wait, span,
                    None if match is None else match[1], proxy,
                    None if proxy is None else span - proxy,
                    tel_wait if proxy is None else proxy))

    for r in rows:
        key = tuple(r[:6])
        if key != turn:
            close()
            turn, cands = key, []
        if r[6] is not None:
            cands.append((abs(float(r[7]) - float(r[3])), str(r[6]), float(r[8])))
    close()
    return out
