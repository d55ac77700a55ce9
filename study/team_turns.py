"""Agent turns of a team study, rebuilt from the agents' own telemetry and kept in
``team_turns`` (schema 10), so the team view aggregates turns, not every event.

A turn starts at the person's prompt (``turn_start``) in one agent and holds that agent's
model requests (``api_request``: its end is the record's time, its duration the agent's own
timing), Codex's stream end (``answer_end``), tool runs, the person's tool decisions and the
time the agent waited for them (``agent_wait``), until that person's next prompt in the same
agent. ``wait_ns`` is prompt → the end of the final answer, less the time the agent waited
for the person's decisions (deciding is not waiting); ``gap_ns`` runs to the person's next
turn in any agent (the team view's active time). Durations raw (× ``time_scale`` = real).

The receiver refreshes a person's turns after each batch it writes
(:func:`refresh_team_turns`, from the turn open at the batch's first record), and with them
the weekly rollup (``flowtrial.study.team_rollup``); the SQL is portable (SQLite ≥ 3.25
window functions, PostgreSQL).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Select, String, and_, case, cast, delete, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement
from sqlmodel import SQLModel

from .schema import Event, TeamTurn
from .team_rollup import MONDAY_SHIFT_NS, NS, WEEK_NS, rebuild_rollup, refresh_rollup

__all__ = ["TeamTurn", "json_field", "rebuild_team_turns", "refresh_team_turns",
           "telemetry_turns"]

DECISION_KINDS = ("accept", "reject", "partial_accept")
TURN_KINDS = ("turn_start", "api_request", "answer_end", "tool_result", "agent_wait",
              *DECISION_KINDS)


EV = SQLModel.metadata.tables["events"].c
TT_T = SQLModel.metadata.tables["team_turns"]
TT = TT_T.c
_ = (Event, TeamTurn)  # their tables are registered by their models


def json_field(column: ColumnElement[Any], key: str, dialect: str) -> ColumnElement[Any]:
    """``column``'s JSON text field ``key`` as text, on SQLite and PostgreSQL."""
    if dialect == "postgresql":
        return func.json_extract_path_text(cast(column, JSON), key)
    return func.json_extract(column, f"$.{key}")


def person_decision() -> ColumnElement[bool]:
    """Not a tool decision the agent's configuration took (those are not the person's)."""
    return ~and_(EV.source == "otel", EV.payload_json.like('%"decided_by": "config"%'))


def telemetry_turns(dialect: str, participants: tuple[str, ...] = (),
                    since_ns: int | None = None) -> Select[Any]:
    """Turns computed from the events: ``pid, agent, model, start_ns, end_ns, wait_ns,
    calls, decided, accepted, decide_s, first_call_ns`` (events from ``since_ns``, which
    must be a turn's start)."""
    agent = func.coalesce(json_field(EV.payload_json, "agent", dialect), "unknown")
    seq = func.sum(case((EV.kind == "turn_start", 1), else_=0)).over(
        partition_by=(EV.participant_id, agent), order_by=(EV.ts_ns, EV.id))
    model = case((EV.kind == "api_request", json_field(EV.payload_json, "model", dialect)),
                 else_=None)
    parts = [EV.source == "otel", EV.kind.in_(TURN_KINDS)]
    if participants:
        parts.append(EV.participant_id.in_(participants))
    if since_ns is not None:
        parts.append(EV.ts_ns >= since_ns)
    e = (select(EV.participant_id.label("pid"), agent.label("agent"), seq.label("seq"),
                EV.kind.label("kind"), EV.ts_ns.label("ts"), EV.duration_s.label("dur"),
                model.label("model"), person_decision().label("by_person"),
                # Claude Code reports a call twice (log and span): count the logs only.
                EV.payload_json.like('%"span": true%').label("is_span"))
         .where(*parts).subquery())
    k = e.c.kind
    prompt = func.min(case((k == "turn_start", e.c.ts), else_=None))
    # The final answer's end: a request's end (its record's time), or Codex's stream end
    # (Codex times a request to its response headers only).
    answer = func.max(case((k.in_(("api_request", "answer_end")), e.c.ts), else_=None))
    decide = func.coalesce(func.sum(case((k == "agent_wait", e.c.dur), else_=None)), 0.0)
    decided = and_(k.in_(DECISION_KINDS), e.c.by_person)
    first_call = func.min(case((k == "api_request",
                                e.c.ts - func.coalesce(e.c.dur, 0.0) * NS), else_=None))
    return (select(e.c.pid.label("pid"), e.c.agent.label("agent"),
                   func.coalesce(func.max(e.c.model), "unknown").label("model"),
                   prompt.label("start_ns"), answer.label("end_ns"),
                   (answer - prompt - decide * NS).label("wait_ns"),
                   func.sum(case((and_(k == "api_request", ~e.c.is_span), 1), else_=0)
                            ).label("calls"),
                   func.sum(case((decided, 1), else_=0)).label("decided"),
                   func.sum(case((and_(decided, k == "accept"), 1), else_=0)).label("accepted"),
                   decide.label("decide_s"), first_call.label("first_call_ns"))
            .where(e.c.seq > 0).group_by(e.c.pid, e.c.agent, e.c.seq)
            .having(answer.is_not(None)))


#: How far back :func:`refresh_team_turns` first looks for the turn open at a batch's first
#: record (a person's turns are seconds to minutes long): only if no turn starts in that day
#: does it read the person's whole history. The price: a turn of one agent still receiving
#: records over a day after its prompt, while another agent of the same person had a prompt
#: that day, is not rebuilt by that batch (a full rebuild does it).
LOOKBACK_NS = 86_400 * NS


def _turn_open_at(conn: Connection, pid: str, ts_ns: int) -> int:
    """The earliest start of a turn (any agent of ``pid``) still open at ``ts_ns``: the
    latest prompt of each agent before ``ts_ns``, looked for in the last
    :data:`LOOKBACK_NS` first (an index range on the person's events), then in all."""
    for floor in (ts_ns - LOOKBACK_NS, None):
        # Strictly before: a batch holding a late prompt also rebuilds the turn it cuts
        # short (the records after that prompt were that turn's until it arrived).
        parts = [EV.participant_id == pid, EV.source == "otel", EV.kind == "turn_start",
                 EV.ts_ns < ts_ns]
        if floor is not None:
            parts.append(EV.ts_ns >= floor)
        latest = (select(func.max(EV.ts_ns).label("t")).where(*parts)
                  .group_by(json_field(EV.payload_json, "agent", conn.dialect.name))
                  .subquery())
        lo = conn.execute(select(func.min(latest.c.t))).scalar()
        if lo is not None:
            return int(lo)
    return ts_ns


def _insert_turns(conn: Connection, participants: tuple[str, ...], since_ns: int | None) -> None:
    """Write the turns of ``participants`` from ``since_ns`` on, in one INSERT … SELECT (no
    row passes through Python), each with its gap to the person's next turn (NULL for the
    person's last)."""
    t = telemetry_turns(conn.dialect.name, participants, since_ns).subquery()
    gap = func.lead(t.c.start_ns).over(partition_by=t.c.pid, order_by=t.c.start_ns)
    ident = (t.c.pid + ":" + t.c.agent + ":" + cast(t.c.start_ns, String))
    cols = ["id", "participant_id", "agent", "model", "week", "start_ns", "end_ns",
            "first_call_ns", "wait_ns", "calls", "decided", "accepted", "decide_s", "gap_ns"]
    sel = select(ident, t.c.pid, t.c.agent, t.c.model,
                 (t.c.start_ns + MONDAY_SHIFT_NS) // WEEK_NS, t.c.start_ns, t.c.end_ns,
                 t.c.first_call_ns, t.c.wait_ns, func.coalesce(t.c.calls, 0),
                 func.coalesce(t.c.decided, 0), func.coalesce(t.c.accepted, 0),
                 t.c.decide_s, gap - t.c.start_ns)
    conn.execute(TT_T.insert().from_select(cols, sel))


def refresh_team_turns(conn: Connection, pid: str, since_ns: int) -> int:
    """Rebuild ``pid``'s turns from the one open at ``since_ns`` on, and their weekly
    rollup (same transaction: the two never disagree); returns the turns written. The turn
    before keeps its row; only its gap to the next turn is updated."""
    lo = _turn_open_at(conn, pid, since_ns)
    conn.execute(delete(TT_T).where(TT.participant_id == pid, TT.start_ns >= lo))
    _insert_turns(conn, (pid,), lo)
    # Counted, not the driver's rowcount: psycopg reports -1 for INSERT … SELECT.
    n = int(conn.execute(select(func.count()).where(
        TT.participant_id == pid, TT.start_ns >= lo)).scalar_one())
    prev = conn.execute(select(TT.id, TT.start_ns).where(
        TT.participant_id == pid, TT.start_ns < lo).order_by(TT.start_ns.desc()).limit(1)).first()
    if prev is not None:
        nxt = conn.execute(select(func.min(TT.start_ns)).where(
            TT.participant_id == pid, TT.start_ns >= lo)).scalar()
        conn.execute(update(TT_T).where(TT.id == prev[0]).values(
            gap_ns=None if nxt is None else int(nxt) - int(prev[1])))
    refresh_rollup(conn, pid, lo if prev is None else min(lo, int(prev[1])))
    return n


def rebuild_team_turns(conn: Connection) -> int:
    """Every person's turns from scratch (after an import, or a generated team), then the
    weekly rollup, in bulk SQL:
    one statement per person, each an index range of the events (``participant_id,
    ts_ns``: SQLite would otherwise pick the ``kind`` index and read everyone's events), so
    the database's sort stays one person wide however long the study ran."""
    pids = [str(p) for p in conn.execute(select(EV.participant_id).where(
        EV.source == "otel").distinct()).scalars()]
    conn.execute(delete(TT_T))
    for pid in pids:
        _insert_turns(conn, (pid,), 0)
    rebuild_rollup(conn)
    return int(conn.execute(select(func.count()).select_from(TT_T)).scalar_one())
