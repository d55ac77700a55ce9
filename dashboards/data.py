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
from sqlalchemy import Table, and_, case, func, select
from sqlalchemy.sql import ColumnElement
from sqlmodel import SQLModel

from flowtrial.study.schema import Assignment, Audit, Cycle, Event, Participant, Persistence, Task
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




def table(model: type[SQLModel]) -> Table:
    """The SQLAlchemy table of a schema model: its columns are typed ``Column`` objects,
    where the model's attributes are typed as the Python values of a row."""
    return SQLModel.metadata.tables[str(model.__tablename__)]


CYCLE_T, EVENT_T, TASK_T = table(Cycle), table(Event), table(Task)
PARTICIPANT_T, ASSIGNMENT_T = table(Participant), table(Assignment)
PERSISTENCE_T, AUDIT_T = table(Persistence), table(Audit)
CYCLE, EVENT, TASK = CYCLE_T.c, EVENT_T.c, TASK_T.c
PARTICIPANT, PERSISTENCE = PARTICIPANT_T.c, PERSISTENCE_T.c


@st.cache_resource(show_spinner=False)
def database(url: str) -> Database:
    """One open ``Database`` per URL for the whole server (engines are thread-safe)."""
    return open_db(url)


def wall_request() -> ColumnElement[Any]:
    """UTC epoch ns of a cycle's request (the schema's wall = anchor + (t − mono anchor))."""
    return CYCLE.wall_anchor_ns + (CYCLE.t_request_ns - CYCLE.mono_anchor_ns)


def freshness(url: str) -> tuple[int, ...]:
    """Cheap change token: (cycles, last cycle done wall ns, last event id, last task id,
    participants, last audit id).

    Not cached on purpose: it is what tells the caches that the study moved on. It runs on
    every rerun, so it reads no big table whole: events and tasks only ever gain rows with a
    higher id (integer primary keys), so their ``max(id)`` — one step down the primary-key
    index on SQLite and PostgreSQL — changes with every batch, where ``count(*)`` read all
    54 M events of a year (0.5 s CPU). Rows are deleted only by a withdrawal, which writes
    an ``audit`` line in the same transaction: its ``max(id)`` covers deletions."""
    done = CYCLE.wall_anchor_ns + (func.coalesce(CYCLE.t_done_ns, CYCLE.t_request_ns)
                                   - CYCLE.mono_anchor_ns)
    with database(url).engine.connect() as conn:
        n_cyc, last = conn.execute(select(func.count(), func.max(done)).select_from(CYCLE_T)).one()
        ev, task, audit = (conn.execute(select(func.max(t.c.id))).scalar_one()
                           for t in (EVENT_T, TASK_T, AUDIT_T))
        n_part = conn.execute(select(func.count()).select_from(PARTICIPANT_T)).scalar_one()
    return (int(n_cyc), int(last or 0), int(ev or 0), int(task or 0), int(n_part),
            int(audit or 0))


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
        parts = [str(p) for p in conn.execute(
            select(PARTICIPANT.id).order_by(PARTICIPANT.enrolled_index)).scalars()]
        arms = sorted(str(a) for a in conn.execute(select(CYCLE.arm).distinct()).scalars())
        tasks = sorted(str(t) for t in conn.execute(select(TASK.name).distinct()).scalars())
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
        out.append(CYCLE.participant_id.in_(f.participants))
    if f.arms:
        out.append(CYCLE.arm.in_(f.arms))
    if f.tasks:
        out.append(CYCLE.task_id.in_(select(TASK.id).where(TASK.name.in_(f.tasks))))
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
    ok = case((CYCLE.status == "ok", 1), else_=0)
    viol = case((CYCLE.violation.is_(True), 1), else_=0)
    q = (select(CYCLE.arm, func.count(), func.sum(ok), func.count(CYCLE.participant_id.distinct()),
                func.avg(CYCLE.target_ttft_ms), func.avg(CYCLE.experienced_ttft_ms),
                func.avg(CYCLE.target_tps), func.avg(CYCLE.achieved_tps), func.avg(viol))
         .where(*cycle_where(f)).group_by(CYCLE.arm).order_by(CYCLE.arm))
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

    q = select(*[CYCLE[c] for c in MANIPULATION_COLUMNS]).where(*cycle_where(f))
    db = database(url)
    with db.engine.connect() as conn:
        df = _frame(conn.execute(q), list(MANIPULATION_COLUMNS))
    try:
        config = db.config()
        return manipulation_check(df, time_scale=scale, model_speed=model_speed(config),
                                  precision_ms=config.study.precision_ms).to_dict()
    except AnalysisInputError as exc:
        return {"skipped": str(exc)}


@st.cache_data(show_spinner=False, max_entries=32)
def histograms(url: str, fresh: tuple[int, ...], scale: float, f: Filters) -> pd.DataFrame:
    """Per arm and measure, cycle counts in log-spaced bins: experienced TTFT, total wait
    (request → last token) and cycle time (request → the participant's next request)."""
    raw = lambda e: tuple(x / scale for x in e)  # noqa: E731 - edges in raw seconds
    ttft = CYCLE.experienced_ttft_ms / 1000.0
    wait = (CYCLE.t_last_sent_ns - CYCLE.t_request_ns) / float(NS)
    nxt = func.lead(CYCLE.t_request_ns).over(partition_by=CYCLE.participant_id,
                                             order_by=CYCLE.t_request_ns)
    # The cycle time needs every cycle of a participant, so the window runs before filters.
    inner = select(CYCLE.id.label("id"), CYCLE.arm.label("arm"), CYCLE.status.label("status"),
                   ((nxt - CYCLE.t_request_ns) / float(NS)).label("ct")).subquery()
    out: list[tuple[Any, str, Any, Any, tuple[float, ...]]] = []
    with database(url).engine.connect() as conn:
        for name, expr, edges in (("experienced TTFT", ttft, WAIT_EDGES_S),
                                  ("total wait", wait, WAIT_EDGES_S)):
            b = _bins(expr, raw(edges)).label("b")
            q = (select(CYCLE.arm, b, func.count()).where(CYCLE.status == "ok", *cycle_where(f))
                 .group_by(CYCLE.arm, b))
            out += [(a, name, i, n, edges) for a, i, n in conn.execute(q) if i is not None]
        b = _bins(inner.c.ct, raw(TIME_EDGES_S)).label("b")
        q = (select(inner.c.arm, b, func.count()).join(CYCLE_T, CYCLE.id == inner.c.id)
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
    kind = EVENT.kind
    q = (select(CYCLE.arm, kind, func.count(CYCLE.id.distinct()))
         .join(EVENT_T, EVENT.cycle_id == CYCLE.id)
         .where(kind.in_(list(DECISIONS)), ~config_decision(), *cycle_where(f))
         .group_by(CYCLE.arm, kind))
    pq = (select(CYCLE.arm, PERSISTENCE.interval_s, func.count(),
                 func.sum(case((PERSISTENCE.persisted.is_(True), 1), else_=0)))
          .join(PERSISTENCE_T, PERSISTENCE.cycle_id == CYCLE.id).where(*cycle_where(f))
          .group_by(CYCLE.arm, PERSISTENCE.interval_s))
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
    return and_(EVENT.source == "otel", EVENT.payload_json.like('%"decided_by": "config"%'))


def agent_events_by_arm(url: str, fresh: tuple[int, ...], scale: float, f: Filters
                        ) -> pd.DataFrame:
    """Agent telemetry on the filtered cycles, one row per event: arm, cycle_id, kind,
    decided_by (person / config / None), decide_s (a decision − the proposing answer's last
    token) and duration_s, in real seconds."""
    last = CYCLE.wall_anchor_ns + (CYCLE.t_last_sent_ns - CYCLE.mono_anchor_ns)
    by = case((EVENT.payload_json.like('%"decided_by": "config"%'), "config"),
              (EVENT.payload_json.like('%"decided_by": "person"%'), "person"), else_=None)
    q = (select(CYCLE.arm, CYCLE.id, EVENT.kind, by, EVENT.ts_ns - last, EVENT.duration_s)
         .join(EVENT_T, EVENT.cycle_id == CYCLE.id)
         .where(EVENT.source == "otel", EVENT.kind.in_(
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
    span = (TASK.ended_at_ns - TASK.started_at_ns) / float(NS)
    q = select(TASK.id, TASK.participant_id, TASK.name, TASK.arm, TASK.period,
               TASK.forecast_fast_s, TASK.forecast_slow_s, func.coalesce(span, TASK.time_s),
               TASK.status)
    if f.participants:
        q = q.where(TASK.participant_id.in_(f.participants))
    if f.arms:
        q = q.where(TASK.arm.in_(f.arms))
    if f.tasks:
        q = q.where(TASK.name.in_(f.tasks))
    with database(url).engine.connect() as conn:
        df = _frame(conn.execute(q), ["task_id", "participant_id", "name", "arm", "period",
                                      "forecast_fast_s", "forecast_slow_s", "task_time_s",
                                      "status"])
    for col in ("forecast_fast_s", "forecast_slow_s", "task_time_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["task_time_s"] *= scale
    return df


@st.cache_data(show_spinner=False, max_entries=32)
def participant_days(url: str, fresh: tuple[int, ...], participant: str) -> list[str]:
    """UTC days on which ``participant`` sent at least one request (ISO dates)."""
    day = (wall_request() // DAY_NS).label("d")
    q = select(day).where(CYCLE.participant_id == participant).group_by(day).order_by(day)
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
    cols = [CYCLE[c] for c in CYCLE_COLUMNS]
    kinds = [*FOCUS_KINDS, *AFK_KINDS, *DECISIONS, *AGENT_SPANS]
    margin = 3600 * NS
    with database(url).engine.connect() as conn:
        cyc = _frame(conn.execute(select(*cols).where(
            CYCLE.participant_id == participant, wall_request() >= lo, wall_request() < hi)
            .order_by(CYCLE.t_request_ns)), list(CYCLE_COLUMNS))
        ev = _frame(conn.execute(select(
            EVENT.participant_id, EVENT.cycle_id, EVENT.kind, EVENT.ts_ns, EVENT.source,
            EVENT.payload_json, EVENT.duration_s).where(
            EVENT.participant_id == participant, EVENT.ts_ns >= lo - margin,
            EVENT.ts_ns < hi + margin, EVENT.kind.in_(kinds))),
            ["participant_id", "cycle_id", "kind", "ts_ns", "source", "payload_json",
             "duration_s"])
        part = _frame(conn.execute(select(PARTICIPANT.id, PARTICIPANT.working_apps_json,
                                          PARTICIPANT.simulated)
                                   .where(PARTICIPANT.id == participant)),
                      ["id", "working_apps_json", "simulated"])
    return {"cycles": cyc, "events": ev, "participants": part}


def enrolled_without_cycles(url: str) -> dict[str, int]:
    """Enrollment facts for the empty state: participants and assignments so far."""
    with database(url).engine.connect() as conn:
        n_part = conn.execute(select(func.count()).select_from(PARTICIPANT_T)).scalar_one()
        n_assign = conn.execute(select(func.count()).select_from(ASSIGNMENT_T)).scalar_one()
    return {"participants": int(n_part), "assignments": int(n_assign)}


__all__ = [
    "StudyInfo", "arm_summary", "manipulation", "cycle_where", "database", "decisions_by_arm",
    "enrolled_without_cycles", "filter_options", "freshness", "histograms",
    "participant_day_tables", "participant_days", "study_info", "task_times",
]
