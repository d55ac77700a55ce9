"""Agent turns: grouping cycles into the wait a person actually has (docs/concepts/turns.md).

A turn starts at a ``human`` request and holds the ``continuation`` calls that hand tool
results back, and any ``retry`` of one of its requests, until a final answer (a call without
tool calls). ``side`` calls (titles, summaries, probes) are counted on the turn open at the
time but are no part of its wait.

Two things live here, shared by the proxy (which builds turns as requests arrive) and by
:func:`rebuild_turns` (which rebuilds them from cycles, e.g. for imported or older data):

- :class:`TurnAssigner`: which turn a classified request joins (a state machine per
  participant, fed requests in arrival order and call ends as they happen);
- :func:`summarize_turn`: the ``turns`` row of a turn from its calls. A turn's row is a
  function of its cycles alone, so the proxy's rows and the rebuilt ones are the same.

Cycles recorded before schema version 4 have no ``request_kind``: :func:`infer_kinds` gives
them one from what the cycles hold (a call that follows one with tool calls is a
continuation), naming the rule ``inferred:…``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "KINDS",
    "Call",
    "OpenTurn",
    "TurnAssigner",
    "TurnRules",
    "call_from_row",
    "infer_kinds",
    "latest_recorded_turn",
    "rebuild_turns",
    "summarize_turn",
    "turn_id_for",
    "turn_rows_from_cycles",
]

Kind = Literal["human", "continuation", "side", "retry"]
KINDS: tuple[str, ...] = ("human", "continuation", "side", "retry")


@dataclass(frozen=True)
class TurnRules:
    """The windows that decide retries and how long a turn waits for its next call."""

    retry_window_s: float = 60.0  # an identical request within this is the client re-asking
    idle_limit_s: float = 600.0  # a turn no call joins for this long is over
    #: A user-role request this soon after its conversation's answer ended cannot be a
    #: person's (docs/concepts/turns.md#the-typing-speed-rule): it continues the turn.
    typing_window_s: float = 1.0
    #: A lone ``human`` request is revised to ``side`` when a request on another
    #: conversation with the same new user text follows within this (a title call).
    revise_window_s: float = 60.0


def turn_id_for(first_cycle_id: str) -> str:
    """A turn's id: its first cycle's id with ``trn_`` for ``cyc_`` (the same on rebuild)."""
    return "trn_" + first_cycle_id.removeprefix("cyc_")


@dataclass(slots=True)
class Call:
    """What a turn needs of one cycle. Times are ns on the cycle's own monotonic timeline;
    ``offset_ns`` (wall − mono) puts cycles of different processes on one clock."""

    cycle_id: str
    participant_id: str
    kind: str
    t_request_ns: int
    t_end_ns: int | None  # the last token sent (else when the cycle ended)
    offset_ns: int = 0
    t_upstream_last_ns: int | None = None
    t_last_sent_ns: int | None = None  # None when no output went out
    shaped: bool = False
    tool_calls: int = 0
    status: str = "ok"
    arm: str = ""
    period: int | None = None
    task_id: int | None = None
    protocol: str = "chat"
    client: str | None = None
    conversation_key: str | None = None
    mono_anchor_ns: int = 0
    wall_anchor_ns: int = 0
    simulated: bool = False
    kind_rule: str | None = None
    input_key: str | None = None  # hash of the request's new user text (schema 11)
    offers_tools: bool | None = None
    turn_id: str | None = None

    @property
    def final(self) -> bool:
        """A final answer: it ended well and asked for no tool."""
        return self.status == "ok" and self.tool_calls == 0 and self.t_end_ns is not None

    @property
    def injected_ns(self) -> int:
        """How much later the last output token (text or tool-call arguments) reached the
        client than the upstream's last event reached the proxy (shaping)."""
        if not self.shaped or self.t_last_sent_ns is None or self.t_upstream_last_ns is None:
            return 0
        return max(0, self.t_last_sent_ns - self.t_upstream_last_ns)


def call_from_row(row: Any) -> Call:
    """A :class:`Call` from a ``cycles`` row (a mapping or an object with its columns)."""
    g: Callable[..., Any] = (row.get if isinstance(row, dict)
                             else (lambda k, d=None: getattr(row, k, d)))
    mono, wall = int(g("mono_anchor_ns") or 0), int(g("wall_anchor_ns") or 0)
    end = g("t_last_sent_ns")
    if end is None:
        end = g("t_done_ns")
    return Call(
        cycle_id=g("id"), participant_id=g("participant_id"), kind=g("request_kind") or "human",
        t_request_ns=int(g("t_request_ns")), t_end_ns=None if end is None else int(end),
        offset_ns=wall - mono, t_upstream_last_ns=g("t_upstream_last_ns"),
        t_last_sent_ns=g("t_last_sent_ns"),
        shaped=bool(g("shaped")), tool_calls=int(g("tool_calls") or 0),
        status=g("status") or "ok", arm=g("arm") or "", period=g("period"),
        task_id=g("task_id"), protocol=g("protocol") or "chat", client=g("client"),
        conversation_key=g("conversation_key"), mono_anchor_ns=mono, wall_anchor_ns=wall,
        simulated=bool(g("simulated")), kind_rule=g("kind_rule"), input_key=g("input_key"),
        offers_tools=g("offers_tools"), turn_id=g("turn_id"),
    )


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, cur_a, cur_b = 0, None, None
    for a, b in sorted(spans):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a  # type: ignore[operator]
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a  # type: ignore[operator]
    return total


def summarize_turn(turn_id: str, calls: Sequence[Call]) -> dict[str, Any]:
    """The ``turns`` row for a turn's calls (side calls included, and counted only).

    ``wait`` runs from the first request to the last token of the final answer (of the last
    call, if the turn has none yet); ``model`` is the time some model call was open (request
    → last token, overlaps counted once), of which ``injected`` the proxy added; ``tool`` the
    time between a call that asked for tools and the continuation that followed; ``gap`` the
    rest of the wait (client overhead, a retry's pause)."""
    main = sorted((c for c in calls if c.kind != "side"),
                  key=lambda c: (c.t_request_ns + c.offset_ns, c.cycle_id))
    if not main:
        raise ValueError(f"turn {turn_id} has no model call")
    first = main[0]
    base = first.offset_ns  # everything on the first call's timeline

    def on_first(t: int, c: Call) -> int:
        return t + c.offset_ns - base

    spans = [(on_first(c.t_request_ns, c), on_first(c.t_end_ns, c)) for c in main
             if c.t_end_ns is not None]
    ended = [c for c in main if c.t_end_ns is not None]
    finals = [c for c in ended if c.final]
    last = max(finals or ended, key=lambda c: on_first(c.t_end_ns, c), default=None)  # type: ignore[arg-type]
    t_start = first.t_request_ns
    t_end = on_first(last.t_end_ns, last) if last is not None else None  # type: ignore[arg-type]
    tool_ns = 0
    for prev, cur in zip(main, main[1:], strict=False):
        if cur.kind == "continuation" and prev.tool_calls > 0 and prev.t_end_ns is not None:
            tool_ns += max(0, on_first(cur.t_request_ns, cur) - on_first(prev.t_end_ns, prev))
    model_ns = _union_ns(spans)
    wait_ns = None if t_end is None else max(0, t_end - t_start)
    if finals:
        status = "complete"
    elif any(c.status != "ok" for c in main):
        status = "error"
    else:
        status = "open"
    ms = 1e6
    return {
        "id": turn_id,
        "participant_id": first.participant_id,
        "arm": first.arm,
        "period": first.period,
        "task_id": first.task_id,
        "protocol": first.protocol,
        "client": first.client,
        "conversation_key": first.conversation_key,
        "mono_anchor_ns": first.mono_anchor_ns,
        "wall_anchor_ns": first.wall_anchor_ns,
        "t_start_ns": t_start,
        "t_end_ns": t_end,
        "started_at": datetime.fromtimestamp((t_start + base) / 1e9, UTC),
        "model_calls": len(main),  # retries included
        "side_calls": sum(1 for c in calls if c.kind == "side"),
        "retries": sum(1 for c in main if c.kind == "retry"),
        "tool_calls": sum(c.tool_calls for c in main),
        "wait_ms": None if wait_ns is None else wait_ns / ms,
        "model_ms": model_ns / ms,
        "injected_ms": sum(c.injected_ns for c in main) / ms,
        "tool_ms": tool_ns / ms,
        "gap_ms": None if wait_ns is None else max(0, wait_ns - model_ns - tool_ns) / ms,
        "status": status,
        "first_cycle_id": first.cycle_id,
        "last_cycle_id": last.cycle_id if last is not None else None,
        "simulated": first.simulated,
    }


# ---------------------------------------------------------------------------- assignment


@dataclass
class OpenTurn:
    """A turn a further call may still join."""

    id: str
    conversation_key: str | None
    model: str | None
    offers_tools: bool
    client: str | None
    last_activity_ns: int  # on the wall clock
    closed: bool = False  # a final answer came: only a retry or a side call may still join
    calls: int = 1  # requests in its wait (side calls not counted)
    failed: bool = False  # its latest call failed (upstream error or cut): the turn ended


@dataclass
class _Participant:
    turns: dict[str, OpenTurn] = field(default_factory=dict)  # by turn id, oldest first
    recent: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # request key
    #: conversation key -> (when its latest answer ended well, that answer's turn id)
    answers: dict[str | None, tuple[int, str]] = field(default_factory=dict)
    person_ns: int | None = None  # the latest sign that the person acted (an event)


class TurnAssigner:
    """Which turn each request joins, per participant, fed in arrival order.

    :meth:`view` gives the classifier what it may look at (the participant's latest turn,
    whether a request is a repeat); :meth:`assign` files a classified request; :meth:`ended`
    notes a call's end (a final answer closes its turn). Times are wall-clock ns."""

    def __init__(self, rules: TurnRules | None = None) -> None:
        self.rules = rules or TurnRules()
        self._by: dict[str, _Participant] = {}

    def _p(self, participant_id: str) -> _Participant:
        p = self._by.get(participant_id)
        if p is None:
            p = self._by[participant_id] = _Participant()
        return p

    def _expire(self, p: _Participant, now_ns: int) -> None:
        idle = int(self.rules.idle_limit_s * 1e9)
        for tid in [t for t, o in p.turns.items() if now_ns - o.last_activity_ns > idle]:
            del p.turns[tid]
        window = int(self.rules.retry_window_s * 1e9)
        for key in [k for k, (t, _) in p.recent.items() if now_ns - t > window]:
            del p.recent[key]
        for conv in [k for k, (t, _) in p.answers.items() if now_ns - t > idle]:
            del p.answers[conv]

    def latest(self, participant_id: str, now_ns: int) -> OpenTurn | None:
        """The participant's most recent turn still within the idle limit (open or closed)."""
        p = self._p(participant_id)
        self._expire(p, now_ns)
        return next(reversed(p.turns.values()), None)

    def held(self, participant_id: str, now_ns: int) -> set[str]:
        """Ids of the participant's turns still within the idle limit."""
        p = self._p(participant_id)
        self._expire(p, now_ns)
        return set(p.turns)

    def repeat_of(self, participant_id: str, request_key: str | None, now_ns: int) -> bool:
        """Whether the same request came from this participant within the retry window."""
        if request_key is None:
            return False
        p = self._p(participant_id)
        self._expire(p, now_ns)
        return request_key in p.recent

    def assign(self, participant_id: str, cycle_id: str, kind: str, now_ns: int, *,
               conversation_key: str | None = None, request_key: str | None = None,
               model: str | None = None, offers_tools: bool = False,
               client: str | None = None, join: str | None = None) -> str | None:
        """The turn id for a request classified ``kind`` (None for a side call outside any
        turn); ``join`` names the turn a continuation joins even if it was closed (the
        typing-speed rule reopens it)."""
        p = self._p(participant_id)
        self._expire(p, now_ns)
        turn: OpenTurn | None = None
        if join is not None and join in p.turns:
            turn = p.turns[join]
            turn.closed = False
        elif kind == "retry" and request_key in p.recent:
            tid = p.recent[request_key][1]
            if tid is None:  # the client re-asked a side call: still a side call's
                return None
            turn = p.turns.get(tid)
            if turn is not None:
                turn.failed = False
        elif kind == "continuation":
            live = [t for t in p.turns.values() if not t.closed]
            turn = next((t for t in reversed(live) if t.conversation_key == conversation_key),
                        live[-1] if live else None)
        elif kind == "side":
            live = [t for t in p.turns.values() if not t.closed]
            turn = live[-1] if live else None
        if turn is None and kind != "side":
            turn = OpenTurn(turn_id_for(cycle_id), conversation_key, model, offers_tools,
                            client, now_ns)
            if kind == "human":  # a new prompt in a conversation ends its earlier turn
                for other in p.turns.values():
                    if other.conversation_key == conversation_key:
                        other.closed = True
            p.turns[turn.id] = turn
        elif turn is not None and kind != "side":
            turn.calls += 1
        if turn is not None and kind != "side":
            turn.last_activity_ns = max(turn.last_activity_ns, now_ns)
            if kind == "retry":
                turn.closed = False  # the client re-asked: the person is still waiting
        if request_key is not None:
            p.recent[request_key] = (now_ns, turn.id if turn is not None else None)
        return turn.id if turn is not None else None

    def adopt(self, participant_id: str, turn: OpenTurn, cycle_id: str) -> None:
        """File the request ``cycle_id`` (just assigned) into ``turn`` instead: a turn that
        another proxy process started (its record says so). The turn the request had just
        started is dropped; other turns of the conversation are over."""
        p = self._p(participant_id)
        own = turn_id_for(cycle_id)
        if own != turn.id:
            p.turns.pop(own, None)
        for other in p.turns.values():
            if other.conversation_key == turn.conversation_key and other.id != turn.id:
                other.closed = True
        known = p.turns.pop(turn.id, None)
        if known is not None:
            turn.last_activity_ns = max(turn.last_activity_ns, known.last_activity_ns)
        p.turns[turn.id] = turn  # the latest turn now
        for key, (t, tid) in list(p.recent.items()):
            if tid == own:
                p.recent[key] = (t, turn.id)

    def ended(self, participant_id: str, turn_id: str | None, kind: str, final: bool,
              now_ns: int, failed: bool = False) -> None:
        """A call of ``turn_id`` ended; a final answer (not a side call's) closes the turn,
        and so does a failed call (an upstream error or cut: new input opens a new turn)."""
        if turn_id is None or kind == "side":
            return
        p = self._p(participant_id)
        turn = p.turns.get(turn_id)
        if turn is not None:
            turn.last_activity_ns = max(turn.last_activity_ns, now_ns)
            turn.failed = failed
            if final or failed:
                turn.closed = True
            if not failed:
                p.answers[turn.conversation_key] = (now_ns, turn_id)
            else:
                p.answers.pop(turn.conversation_key, None)

    def answer_gap(self, participant_id: str, conversation_key: str | None, now_ns: int
                   ) -> tuple[float, str, bool] | None:
        """Seconds since the conversation's latest answer ended well, its turn, and whether
        the person showed they acted since (None: no such answer within the idle limit)."""
        p = self._p(participant_id)
        self._expire(p, now_ns)
        seen = p.answers.get(conversation_key)
        if conversation_key is None or seen is None or seen[1] not in p.turns:
            return None
        end, tid = seen
        acted = p.person_ns is not None and p.person_ns >= end
        return max(0.0, (now_ns - end) / 1e9), tid, acted

    def person_acted(self, participant_id: str, now_ns: int) -> None:
        """Something showed the person acted (typed, clicked) at ``now_ns``."""
        p = self._p(participant_id)
        p.person_ns = max(p.person_ns or now_ns, now_ns)

    def turn(self, participant_id: str, turn_id: str) -> OpenTurn | None:
        """A turn still held, by id."""
        return self._p(participant_id).turns.get(turn_id)

    def drop(self, participant_id: str, turn_id: str) -> None:
        """Forget a turn (its only request was revised into another turn's side call)."""
        p = self._p(participant_id)
        p.turns.pop(turn_id, None)
        for key, (t, tid) in list(p.recent.items()):
            if tid == turn_id:
                p.recent[key] = (t, None)


# ---------------------------------------------------------------------------- older data


def infer_kinds(calls: Sequence[Call], rules: TurnRules | None = None
                ) -> dict[str, tuple[str, str]]:
    """Kinds for cycles recorded without one (before schema version 4), from the cycles
    alone: cycle id → (kind, rule). ``calls`` are one participant's, in request order.

    A completions call is ``human``; a call that starts after one that asked for tools
    ended, within the idle limit, is a ``continuation``; anything else is ``human``. (Side
    calls and retries cannot be told from what older cycles hold.)"""
    rules = rules or TurnRules()
    idle = int(rules.idle_limit_s * 1e9)
    out: dict[str, tuple[str, str]] = {}
    prev: Call | None = None
    for c in calls:
        if c.protocol == "completions":
            out[c.cycle_id] = ("human", "inferred:completions")
        elif (prev is not None and prev.tool_calls > 0 and prev.t_end_ns is not None
              and 0 <= (c.t_request_ns + c.offset_ns) - (prev.t_end_ns + prev.offset_ns)
              <= idle):
            out[c.cycle_id] = ("continuation", "inferred:after_tool_call")
        else:
            out[c.cycle_id] = ("human", "inferred:default")
        prev = c
    return out


def assign_calls(calls: Iterable[Call], rules: TurnRules | None = None) -> dict[str, str | None]:
    """Turn ids for classified calls without one, in request order (as the proxy would)."""
    assigner = TurnAssigner(rules)
    events: list[tuple[int, int, Call]] = []
    for c in calls:
        events.append((c.t_request_ns + c.offset_ns, 1, c))
        if c.t_end_ns is not None:
            events.append((c.t_end_ns + c.offset_ns, 0, c))
    out: dict[str, str | None] = {}
    for t, what, c in sorted(events, key=lambda e: (e[0], e[1], e[2].cycle_id)):
        if what == 1:
            out[c.cycle_id] = assigner.assign(c.participant_id, c.cycle_id, c.kind, t,
                                              conversation_key=c.conversation_key,
                                              client=c.client)
        else:
            assigner.ended(c.participant_id, out.get(c.cycle_id), c.kind, c.final, t)
    return out


def latest_recorded_turn(database: Any, participant_id: str, conversation_key: str
                         ) -> tuple[str | None, list[Call]]:
    """The id and recorded calls (oldest first) of the participant's latest turn in a
    conversation, whichever proxy process recorded them; (None, []) if there is none. One
    indexed read of the participant's cycles, then the turn's own."""
    from sqlalchemy import select

    from .schema import Cycle

    c = Cycle.__table__.c  # type: ignore[attr-defined]
    with database.engine.connect() as conn:
        tid = conn.execute(
            select(c.turn_id).where(c.participant_id == participant_id,
                                    c.conversation_key == conversation_key,
                                    c.turn_id.is_not(None), c.request_kind != "side")
            .order_by(c.started_at.desc(), c.id.desc()).limit(1)).scalar()
        if tid is None:
            return None, []
        rows = conn.execute(select(Cycle.__table__).where(  # type: ignore[attr-defined]
            c.participant_id == participant_id, c.turn_id == tid)).mappings().all()
    calls = [call_from_row(dict(r)) for r in rows]
    return tid, sorted(calls, key=lambda x: (x.t_request_ns + x.offset_ns, x.cycle_id))


def rebuild_turns(database: Any, rules: TurnRules | None = None) -> int:
    """Rebuild the ``turns`` table from the cycles; returns how many turns there are.

    Cycles without a kind get one (:func:`infer_kinds`) and cycles without a turn get one
    (:class:`TurnAssigner`), both written back; every turn row is then recomputed from its
    cycles (:func:`summarize_turn`), so the proxy's rows come out unchanged."""
    from sqlalchemy import delete, select, update
    from sqlmodel import Session, col

    from .schema import Cycle, Turn
    from .turn_revision import apply_revisions

    with Session(database.engine) as session:
        rows = session.exec(select(Cycle).order_by(  # type: ignore[call-overload]
            Cycle.participant_id, col(Cycle.t_request_ns), Cycle.id)).scalars().all()
        by_participant: dict[str, list[Call]] = {}
        cycles = {}
        for r in rows:
            cycles[r.id] = r
            by_participant.setdefault(r.participant_id, []).append(call_from_row(r))
        changes: dict[str, dict[str, Any]] = {}
        for calls in by_participant.values():
            missing = [c for c in calls if cycles[c.cycle_id].request_kind is None]
            if missing:
                for cid, (kind, rule) in infer_kinds(calls, rules).items():
                    if cycles[cid].request_kind is None:
                        changes.setdefault(cid, {}).update(request_kind=kind, kind_rule=rule)
                for c in calls:
                    if c.cycle_id in changes:
                        c.kind = changes[c.cycle_id]["request_kind"]
            unassigned = [c for c in calls if cycles[c.cycle_id].turn_id is None]
            if unassigned:
                by_id = {c.cycle_id: c for c in unassigned}
                for cid, tid in assign_calls(unassigned, rules).items():
                    if tid is not None:
                        changes.setdefault(cid, {})["turn_id"] = tid
                        by_id[cid].turn_id = tid
            apply_revisions(calls, rules or TurnRules(), changes)
        for cid, values in changes.items():
            session.execute(update(Cycle).where(col(Cycle.id) == cid).values(**values))
        groups: dict[str, list[Call]] = {}
        for calls in by_participant.values():
            for c in calls:
                tid = changes.get(c.cycle_id, {}).get("turn_id") or cycles[c.cycle_id].turn_id
                if tid is not None:
                    groups.setdefault(tid, []).append(c)
        session.execute(delete(Turn))
        turn_rows = [summarize_turn(tid, calls) for tid, calls in groups.items()
                     if any(c.kind != "side" for c in calls)]
        if turn_rows:
            session.execute(Turn.__table__.insert(), turn_rows)  # type: ignore[attr-defined]
        session.commit()
    return len(turn_rows)


def turn_rows_from_cycles(cycles: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` rows for ``cycles`` rows that carry ``turn_id`` (the simulator's): the same
    rows :func:`rebuild_turns` would make, one :func:`summarize_turn` per turn."""
    groups: dict[str, list[Call]] = {}
    for r in cycles:
        if r.get("turn_id") is not None:
            groups.setdefault(r["turn_id"], []).append(call_from_row(r))
    return [summarize_turn(tid, calls) for tid, calls in groups.items()
            if any(c.kind != "side" for c in calls)]
