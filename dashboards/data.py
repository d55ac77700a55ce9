"""SQL aggregations behind the dashboard (SQLAlchemy Core, portable SQLite/PostgreSQL).

Every function takes the database URL and a ``fresh`` token (``freshness``): Streamlit's
``st.cache_data`` keys on its arguments, so a new cycle, event or task (which changes the
token) invalidates the cache, and an unchanged study is never queried twice.

Heavy work happens in the database: counts, means and histograms are ``GROUP BY`` queries
(histogram bins are ``CASE`` expressions over fixed log-spaced edges, since ``LOG`` is not
portable), the cycle time uses the ``LEAD`` window function (SQLite ≥ 3.25, PostgreSQL),
and weeks are integer divisions of epoch nanoseconds. Durations are stored raw; everything
returned here is in real seconds (× the study's ``time_scale``), like
``flowtrial.analysis.metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st
from sqlalchemy import and_, case, func, select
from sqlalchemy.sql import ColumnElement

from flowtrial.study.schema import Assignment, Cycle, Event, Participant, Persistence, Task
from flowtrial.study.storage import Database, open_db

from .filters import Filters

NS = 1_000_000_000
DAY_NS = 86_400 * NS
WEEK_NS = 7 * DAY_NS
MONDAY_SHIFT_NS = 3 * DAY_NS  # 1970-01-01 was a Thursday: +3 days makes weeks start Monday
DECISIONS = {"accept": "accept", "reject": "reject", "partial_accept": "partial"}
#: Agent telemetry drawn on the timeline: the agent waiting for the person, a tool running.
AGENT_SPANS = ("agent_wait", "tool_result")
# Log-spaced histogram edges for waits and times (seconds, real).
WAIT_EDGES_S = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
TIME_EDGES_S = (0.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)


@st.cache_resource(show_spinner=False)
def database(url: str) -> Database:
    """One open ``Database`` per URL for the whole server (engines are thread-safe)."""
    return open_db(url)


def wall_request() -> ColumnElement[Any]:
    """UTC epoch ns of a cycle's request (the schema's wall = anchor + (t − mono anchor))."""
    return Cycle.wall_anchor_ns + (Cycle.t_request_ns - Cycle.mono_anchor_ns)


def freshness(url: str) -> tuple[int, int, int, int, int]:
    """Cheap change token: (cycles, last cycle done wall ns, events, tasks, participants).

    Not cached on purpose: it is what tells the caches that the study moved on."""
    done = Cycle.wall_anchor_ns + (func.coalesce(Cycle.t_done_ns, Cycle.t_request_ns)
                                   - Cycle.mono_anchor_ns)
    with database(url).engine.connect() as conn:
        n_cyc, last = conn.execute(select(func.count(), func.max(done)).select_from(Cycle)).one()
        n_ev = conn.execute(select(func.count()).select_from(Event)).scalar_one()
        n_task = conn.execute(select(func.count()).select_from(Task)).scalar_one()
        n_part = conn.execute(select(func.count()).select_from(Participant)).scalar_one()
    return int(n_cyc), int(last or 0), int(n_ev), int(n_task), int(n_part)


@dataclass(frozen=True)
class StudyInfo:
    name: str
    design: str
    unit: str
    time_scale: float
    arms: tuple[str, ...]
    arm_targets: dict[str, dict[str, Any]]
    switch_min_away_s: float
    idle_limit_s: float
    status: dict[str, Any]


@st.cache_data(show_spinner=False, max_entries=16)
def study_info(url: str, fresh: tuple[int, ...]) -> StudyInfo:
    """The study's settings and ``flowtrial.study.status.study_status`` (counts per arm, SRM)."""
    from flowtrial.study.status import study_status

    db = database(url)
    config = db.config()
    return StudyInfo(
        name=config.study.name, design=config.study.design, unit=str(config.study.unit),
        time_scale=float(config.study.time_scale),
        arms=tuple(a.name for a in config.allocated_arms),
        arm_targets={a.name: {"ttft_ms": a.ttft_ms, "tokens_per_second": a.tokens_per_second,
                              "delivery": a.delivery, "shaped": a.shaped}
                     for a in config.allocated_arms},
        switch_min_away_s=float(config.capture.switch_min_away_s),
        idle_limit_s=float(config.study.idle_limit_s),
        status=study_status(db).to_dict(),
    )


@st.cache_data(show_spinner=False, max_entries=16)
def filter_options(url: str, fresh: tuple[int, ...]) -> dict[str, Any]:
    """Values the sidebar filters offer: participants, arms, task names, date span (UTC)."""
    with database(url).engine.connect() as conn:
        parts = conn.execute(select(Participant.id).order_by(Participant.enrolled_index)).scalars()
        parts = [str(p) for p in parts]
        arms = sorted(str(a) for a in conn.execute(select(Cycle.arm).distinct()).scalars())
        tasks = sorted(str(t) for t in conn.execute(select(Task.name).distinct()).scalars())
        lo, hi = conn.execute(select(func.min(wall_request()), func.max(wall_request()))).one()
    span = None
    if lo is not None:
        span = (pd.Timestamp(int(lo), unit="ns", tz="UTC").date(),
                pd.Timestamp(int(hi), unit="ns", tz="UTC").date())
    return {"participants": parts, "arms": arms, "tasks": tasks, "span": span}


def cycle_where(f: Filters) -> list[ColumnElement[bool]]:
    """WHERE clauses on ``cycles`` for the sidebar filters."""
    out: list[ColumnElement[bool]] = []
    if f.start is not None:
        out.append(wall_request() >= pd.Timestamp(f.start, tz="UTC").value)
    if f.end is not None:
        out.append(wall_request() < pd.Timestamp(f.end, tz="UTC").value + DAY_NS)
    if f.participants:
        out.append(Cycle.participant_id.in_(f.participants))
    if f.arms:
        out.append(Cycle.arm.in_(f.arms))
    if f.tasks:
        out.append(Cycle.task_id.in_(select(Task.id).where(Task.name.in_(f.tasks))))
    return out


def _bins(expr: ColumnElement[Any], edges: tuple[float, ...]) -> ColumnElement[Any]:
    """Index of the histogram bin of ``expr`` (edges in the same units); NULL stays NULL."""
    whens = [(expr < e, i) for i, e in enumerate(edges[1:])]
    return case((expr.is_(None), None), *whens, else_=len(edges) - 1)


def _label(edges: tuple[float, ...], i: int) -> str:
    if i >= len(edges) - 1:
        return f"≥ {edges[-1]:g}"
    return f"{edges[i]:g}–{edges[i + 1]:g}"


def _frame(rows: Any, columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame([tuple(r) for r in rows], columns=columns)


@st.cache_data(show_spinner=False, max_entries=32)
def arm_summary(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """Per arm: cycles (ok/other), participants, mean target vs achieved TTFT and tokens/s,
    violation rate — the manipulation check in SQL (means; the report uses medians)."""
    ok = case((Cycle.status == "ok", 1), else_=0)
    viol = case((Cycle.violation.is_(True), 1), else_=0)
    q = (select(Cycle.arm, func.count(), func.sum(ok), func.count(Cycle.participant_id.distinct()),
                func.avg(Cycle.target_ttft_ms), func.avg(Cycle.experienced_ttft_ms),
                func.avg(Cycle.target_tps), func.avg(Cycle.achieved_tps), func.avg(viol))
         .where(*cycle_where(f)).group_by(Cycle.arm).order_by(Cycle.arm))
    with database(url).engine.connect() as conn:
        df = _frame(conn.execute(q), ["arm", "cycles", "cycles_ok", "participants",
                                      "target_ttft_ms", "experienced_ttft_ms", "target_tps",
                                      "achieved_tps", "violation_rate"])
    for col in ("target_ttft_ms", "experienced_ttft_ms", "target_tps", "achieved_tps",
                "violation_rate"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["target_ttft_s"] = df.pop("target_ttft_ms") / 1000 * scale
    df["experienced_ttft_s"] = df.pop("experienced_ttft_ms") / 1000 * scale
    df["target_tps"] /= scale
    df["achieved_tps"] /= scale
    return df


#: The raw cycle columns the manipulation check reads (applied targets, upstream arrivals).
MANIPULATION_COLUMNS = ("arm", "status", "shaped", "stream", "t_request_ns",
                        "t_upstream_first_ns", "t_upstream_first_output_ns",
                        "t_upstream_last_ns", "t_first_sent_ns", "t_last_sent_ns",
                        "target_ttft_ms", "target_tps", "target_delivery", "tokens_sent",
                        "achieved_tps", "violation_ms", "upstream")


@st.cache_data(show_spinner=False, max_entries=32)
def manipulation(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> dict[str, Any]:
    """The report's manipulation check (``flowtrial.analysis.manipulation``) on the filtered
    cycles: the same verdict, misses, fault classes and per-arm rates as ``flowtrial
    analyze`` (its JSON: ``checks.manipulation``), or ``{"skipped": why}``."""
    from flowtrial.analysis import AnalysisInputError
    from flowtrial.analysis.manipulation import manipulation_check
    from flowtrial.analysis.metrics import model_speed

    q = select(*[getattr(Cycle, c) for c in MANIPULATION_COLUMNS]).where(*cycle_where(f))
    db = database(url)
    with db.engine.connect() as conn:
        df = _frame(conn.execute(q), list(MANIPULATION_COLUMNS))
    try:
        return manipulation_check(df, time_scale=scale,
                                  model_speed=model_speed(db.config())).to_dict()
    except AnalysisInputError as exc:
        return {"skipped": str(exc)}


@st.cache_data(show_spinner=False, max_entries=32)
def histograms(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """Per arm and measure, cycle counts in log-spaced bins: experienced TTFT, total wait
    (request → last token) and cycle time (request → the participant's next request)."""
    raw = lambda e: tuple(x / scale for x in e)  # noqa: E731 - edges in raw seconds
    ttft = Cycle.experienced_ttft_ms / 1000.0
    wait = (Cycle.t_last_sent_ns - Cycle.t_request_ns) / float(NS)
    nxt = func.lead(Cycle.t_request_ns).over(partition_by=Cycle.participant_id,
                                             order_by=Cycle.t_request_ns)
    # The cycle time needs every cycle of a participant, so the window runs before filters.
    inner = select(Cycle.id.label("id"), Cycle.arm.label("arm"), Cycle.status.label("status"),
                   ((nxt - Cycle.t_request_ns) / float(NS)).label("ct")).subquery()
    out = []
    with database(url).engine.connect() as conn:
        for name, expr, edges in (("experienced TTFT", ttft, WAIT_EDGES_S),
                                  ("total wait", wait, WAIT_EDGES_S)):
            b = _bins(expr, raw(edges)).label("b")
            q = (select(Cycle.arm, b, func.count()).where(Cycle.status == "ok", *cycle_where(f))
                 .group_by(Cycle.arm, b))
            out += [(a, name, i, n, edges) for a, i, n in conn.execute(q) if i is not None]
        b = _bins(inner.c.ct, raw(TIME_EDGES_S)).label("b")
        q = (select(inner.c.arm, b, func.count()).join(Cycle, Cycle.id == inner.c.id)
             .where(*cycle_where(f)).group_by(inner.c.arm, b))
        out += [(a, "cycle time", i, n, TIME_EDGES_S) for a, i, n in conn.execute(q)
                if i is not None]
    df = pd.DataFrame(
        [{"arm": a, "measure": m, "bin": int(i), "range_s": _label(e, int(i)), "cycles": int(n)}
         for a, m, i, n, e in out], columns=["arm", "measure", "bin", "range_s", "cycles"])
    return df.sort_values(["measure", "arm", "bin"], ignore_index=True)


@st.cache_data(show_spinner=False, max_entries=32)
def decisions_by_arm(url: str, fresh: tuple[int, ...], f: Filters) -> pd.DataFrame:
    """Per arm: cycles with a decision event, accepted / partial / rejected, acceptance rate
    (among decided cycles), and the persistence rate per interval when checked."""
    kind = Event.kind
    q = (select(Cycle.arm, kind, func.count(Cycle.id.distinct()))
         .join(Event, Event.cycle_id == Cycle.id)
         .where(kind.in_(list(DECISIONS)), ~config_decision(), *cycle_where(f))
         .group_by(Cycle.arm, kind))
    pq = (select(Cycle.arm, Persistence.interval_s, func.count(),
                 func.sum(case((Persistence.persisted.is_(True), 1), else_=0)))
          .join(Persistence, Persistence.cycle_id == Cycle.id).where(*cycle_where(f))
          .group_by(Cycle.arm, Persistence.interval_s))
    with database(url).engine.connect() as conn:
        rows = _frame(conn.execute(q), ["arm", "kind", "n"])
        prow = _frame(conn.execute(pq), ["arm", "interval_s", "n", "persisted"])
    wide = (rows.assign(kind=rows["kind"].map(DECISIONS))
            .pivot_table(index="arm", columns="kind", values="n", aggfunc="sum", fill_value=0))
    for k in DECISIONS.values():
        if k not in wide.columns:
            wide[k] = 0
    wide = wide[list(DECISIONS.values())].reset_index()
    decided = wide[list(DECISIONS.values())].sum(axis=1)
    wide["decided"] = decided
    wide["acceptance_rate"] = (wide["accept"] / decided).where(decided > 0)
    for iv, g in prow.groupby("interval_s"):
        rate = (g["persisted"].astype(float) / g["n"].astype(float)).to_numpy()
        wide = wide.merge(pd.DataFrame({"arm": g["arm"].to_numpy(),
                                        f"persisted_{float(iv):g}s_rate": rate}),
                          on="arm", how="left")
    return wide


#: Agent telemetry's tool decisions taken by the agent's configuration (not the person):
#: excluded from the person's decisions (as ``flowtrial.analysis.metrics.person_decisions``).
def config_decision() -> ColumnElement[bool]:
    return and_(Event.source == "otel", Event.payload_json.like('%"decided_by": "config"%'))


def agent_events_by_arm(url: str, fresh: tuple[int, ...], scale: float, f: Filters
                        ) -> pd.DataFrame:
    """Agent telemetry on the filtered cycles, one row per event: arm, cycle_id, kind,
    decided_by (person / config / None), decide_s (a decision − the proposing answer's last
    token) and duration_s, in real seconds."""
    last = Cycle.wall_anchor_ns + (Cycle.t_last_sent_ns - Cycle.mono_anchor_ns)
    by = case((Event.payload_json.like('%"decided_by": "config"%'), "config"),
              (Event.payload_json.like('%"decided_by": "person"%'), "person"), else_=None)
    q = (select(Cycle.arm, Cycle.id, Event.kind, by, Event.ts_ns - last, Event.duration_s)
         .join(Event, Event.cycle_id == Cycle.id)
         .where(Event.source == "otel", Event.kind.in_(
             ["turn_start", "accept", "reject", "partial_accept", "tool_result",
              "agent_wait", "api_request"]), *cycle_where(f)))
    with database(url).engine.connect() as conn:
        df = _frame(conn.execute(q), ["arm", "cycle_id", "kind", "decided_by", "decide_ns",
                                      "duration_s"])
    df["decide_s"] = pd.to_numeric(df["decide_ns"]).astype(float) / NS * scale
    df["duration_s"] = pd.to_numeric(df["duration_s"]).astype(float) * scale
    return df.drop(columns=["decide_ns"])


def agent_summary(events: pd.DataFrame) -> pd.DataFrame:
    """Per arm: tool decisions by the person and by config, the person's acceptance rate and
    median time to decide, cycles the agent waited for the person and the median wait."""
    rows = []
    for arm, g in events.groupby("arm", sort=True):
        dec = g[g["kind"].isin(list(DECISIONS))]
        person = dec[dec["decided_by"] == "person"]
        waits = g[g["kind"] == "agent_wait"].groupby("cycle_id")["duration_s"].sum()
        decide = person["decide_s"][person["decide_s"] >= 0]
        rows.append({
            "arm": arm, "prompts": int((g["kind"] == "turn_start").sum()),
            "tool_decisions": len(dec), "by_person": len(person),
            "by_config": int((dec["decided_by"] == "config").sum()),
            "person_acceptance_rate": (person["kind"].isin(["accept", "partial_accept"]).mean()
                                       if len(person) else None),
            "median_time_to_decide_s": decide.median() if len(decide) else None,
            "cycles_agent_waited": int((waits > 0).sum()),
            "median_agent_wait_s": waits.median() if len(waits) else None,
            "tool_time_s": g.loc[g["kind"] == "tool_result", "duration_s"].sum(),
        })
    return pd.DataFrame(rows)


@st.cache_data(show_spinner=False, max_entries=32)
def agent_by_arm(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """:func:`agent_summary` of :func:`agent_events_by_arm` (cached)."""
    return agent_summary(agent_events_by_arm(url, fresh, scale, f))


@st.cache_data(show_spinner=False, max_entries=32)
def agent_turns(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """Agent telemetry per agent turn (``flowtrial.analysis.turn_telemetry.turn_telemetry``)
    for the filtered participants, arms and dates."""
    from flowtrial.analysis.turn_telemetry import turn_telemetry

    t = turn_telemetry(database(url), list(f.participants) or None, scale)
    if f.arms:
        t = t[t["arm"].isin(f.arms)]
    if f.start is not None:
        t = t[t["start_ns"] >= pd.Timestamp(f.start, tz="UTC").value]
    if f.end is not None:
        t = t[t["start_ns"] < pd.Timestamp(f.end, tz="UTC").value + DAY_NS]
    return t.reset_index(drop=True)


@st.cache_data(show_spinner=False, max_entries=32)
def task_times(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """One row per task (the columns ``flowtrial.analysis.metrics.task_table`` documents that the
    effect estimate needs): task time from start/end, else the imported ``time_s``."""
    span = (Task.ended_at_ns - Task.started_at_ns) / float(NS)
    q = select(Task.id, Task.participant_id, Task.name, Task.arm, Task.period,
               Task.forecast_fast_s, Task.forecast_slow_s, func.coalesce(span, Task.time_s),
               Task.status)
    if f.participants:
        q = q.where(Task.participant_id.in_(f.participants))
    if f.arms:
        q = q.where(Task.arm.in_(f.arms))
    if f.tasks:
        q = q.where(Task.name.in_(f.tasks))
    with database(url).engine.connect() as conn:
        df = _frame(conn.execute(q), ["task_id", "participant_id", "name", "arm", "period",
                                      "forecast_fast_s", "forecast_slow_s", "task_time_s",
                                      "status"])
    for col in ("forecast_fast_s", "forecast_slow_s", "task_time_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["task_time_s"] *= scale
    return df


@st.cache_data(show_spinner=False, max_entries=32)
def team_weekly(url: str, fresh: tuple[int, ...], scale: float, idle_limit_s: float,
                by: str, f: Filters) -> pd.DataFrame:
    """Per week (Monday, UTC) and person or model: cycles, hours active, share of active
    time spent waiting, switches (focus_out events) per active hour, acceptance rate.

    Active time of a cycle is the time to the same person's next request, or just its wait
    when that gap exceeds the study's idle limit (the person stopped working)."""
    group = Cycle.participant_id if by == "person" else func.coalesce(Cycle.model, "unknown")
    wall = wall_request()
    gap = (func.lead(Cycle.t_request_ns).over(partition_by=Cycle.participant_id,
                                              order_by=Cycle.t_request_ns)
           - Cycle.t_request_ns) / float(NS)
    wait = func.coalesce(Cycle.t_last_sent_ns - Cycle.t_request_ns, 0) / float(NS)
    base = select(Cycle.id.label("id"), group.label("who"),
                  ((wall + MONDAY_SHIFT_NS) // WEEK_NS).label("week"),
                  wait.label("wait"), gap.label("gap")).subquery()
    limit = idle_limit_s / scale
    active = case((and_(base.c.gap.is_not(None), base.c.gap <= limit), base.c.gap),
                  else_=base.c.wait)
    filt = select(Cycle.id).where(*cycle_where(f))
    q = (select(base.c.who, base.c.week, func.count(), func.sum(base.c.wait), func.sum(active))
         .where(base.c.id.in_(filt)).group_by(base.c.who, base.c.week))
    # Switches and decisions, attributed to the week of the cycle they belong to (decisions)
    # or of the event (focus_out: also switches outside any wait count for a team).
    dec = (select(base.c.who, base.c.week, func.sum(case((Event.kind == "accept", 1), else_=0)),
                  func.count())
           .join(Event, Event.cycle_id == base.c.id)
           .where(Event.kind.in_(list(DECISIONS)), base.c.id.in_(filt))
           .group_by(base.c.who, base.c.week))
    # // is integer division on both backends (CAST(x / y AS INTEGER) rounds on PostgreSQL).
    ev_week = (Event.ts_ns + MONDAY_SHIFT_NS) // WEEK_NS
    sw_parts = [Event.kind == "focus_out"]
    if f.participants:
        sw_parts.append(Event.participant_id.in_(f.participants))
    with database(url).engine.connect() as conn:
        df = _frame(conn.execute(q), ["who", "week", "cycles", "wait_s", "active_s"])
        dd = _frame(conn.execute(dec), ["who", "week", "accepted", "decided"])
        if by == "person":
            sq = (select(Event.participant_id, ev_week.label("w"), func.count())
                  .where(*sw_parts).group_by(Event.participant_id, "w"))
        else:  # a switch belongs to the model of the cycle it interrupted, if any
            # Group by the label: PostgreSQL sees two coalesce(…, $n) as different expressions.
            sq = (select(func.coalesce(Cycle.model, "unknown").label("m"), ev_week.label("w"),
                         func.count())
                  .join(Cycle, Cycle.id == Event.cycle_id).where(*sw_parts)
                  .group_by("m", "w"))
        ds = _frame(conn.execute(sq), ["who", "week", "switches"])
    if df.empty:
        return pd.DataFrame(columns=["week", "who", "cycles", "hours_active", "waiting_share",
                                     "switches_per_hour", "acceptance_rate"])
    df = df.merge(dd, on=["who", "week"], how="left").merge(ds, on=["who", "week"], how="left")
    for col in ("wait_s", "active_s", "accepted", "decided", "switches"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0.0)
    df["wait_s"] *= scale
    df["active_s"] *= scale
    hours = df["active_s"] / 3600.0
    out = pd.DataFrame({
        "week": pd.to_datetime(df["week"].astype("int64") * WEEK_NS - MONDAY_SHIFT_NS,
                               unit="ns", utc=True).dt.date.astype(str),
        "who": df["who"].astype(str), "cycles": df["cycles"].astype(int),
        "hours_active": hours,
        "waiting_share": (df["wait_s"] / df["active_s"]).where(df["active_s"] > 0),
        "switches_per_hour": (df["switches"] / hours).where(hours > 0),
        "acceptance_rate": (df["accepted"] / df["decided"]).where(df["decided"] > 0),
    })
    return out.sort_values(["week", "who"], ignore_index=True)


@st.cache_data(show_spinner=False, max_entries=32)
def participant_days(url: str, fresh: tuple[int, ...], participant: str) -> list[str]:
    """UTC days on which ``participant`` sent at least one request (ISO dates)."""
    day = (wall_request() // DAY_NS).label("d")
    q = select(day).where(Cycle.participant_id == participant).group_by(day).order_by(day)
    with database(url).engine.connect() as conn:
        days = [int(d) for d in conn.execute(q).scalars()]
    return [str(pd.Timestamp(d * DAY_NS, unit="ns", tz="UTC").date()) for d in days]


def day_bounds_ns(day: str) -> tuple[int, int]:
    start = pd.Timestamp(day, tz="UTC").value
    return start, start + DAY_NS


@st.cache_data(show_spinner=False, max_entries=32)
def participant_day_tables(url: str, fresh: tuple[int, ...], participant: str, day: str
                           ) -> dict[str, pd.DataFrame]:
    """One participant's cycles that day and their events (±1 h, for switches straddling
    the day's edges), read with indexed range queries: the inputs of the timeline."""
    from flowtrial.analysis.metrics import CYCLE_COLUMNS
    from flowtrial.analysis.switches import AFK_KINDS, FOCUS_KINDS

    lo, hi = day_bounds_ns(day)
    cols = [getattr(Cycle, c) for c in CYCLE_COLUMNS]
    kinds = [*FOCUS_KINDS, *AFK_KINDS, *DECISIONS, *AGENT_SPANS]
    margin = 3600 * NS
    with database(url).engine.connect() as conn:
        cyc = _frame(conn.execute(select(*cols).where(
            Cycle.participant_id == participant, wall_request() >= lo, wall_request() < hi)
            .order_by(Cycle.t_request_ns)), list(CYCLE_COLUMNS))
        ev = _frame(conn.execute(select(
            Event.participant_id, Event.cycle_id, Event.kind, Event.ts_ns, Event.source,
            Event.payload_json, Event.duration_s).where(
            Event.participant_id == participant, Event.ts_ns >= lo - margin,
            Event.ts_ns < hi + margin, Event.kind.in_(kinds))),
            ["participant_id", "cycle_id", "kind", "ts_ns", "source", "payload_json",
             "duration_s"])
        part = _frame(conn.execute(select(Participant.id, Participant.working_apps_json,
                                          Participant.simulated)
                                   .where(Participant.id == participant)),
                      ["id", "working_apps_json", "simulated"])
    return {"cycles": cyc, "events": ev, "participants": part}


def enrolled_without_cycles(url: str) -> dict[str, int]:
    """Enrollment facts for the empty state: participants and assignments so far."""
    with database(url).engine.connect() as conn:
        n_part = conn.execute(select(func.count()).select_from(Participant)).scalar_one()
        n_assign = conn.execute(select(func.count()).select_from(Assignment)).scalar_one()
    return {"participants": int(n_part), "assignments": int(n_assign)}


__all__ = [
    "StudyInfo", "arm_summary", "manipulation", "cycle_where", "database", "decisions_by_arm",
    "enrolled_without_cycles", "filter_options", "freshness", "histograms",
    "participant_day_tables", "participant_days", "study_info", "task_times", "team_weekly",
]
