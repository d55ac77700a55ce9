"""The proxy's turn tracker: classifies each request as it arrives and keeps the ``turns``
table up to date as its cycles are recorded.

Hooks, nothing else in the request path: :meth:`TurnTracker.arrive` (once the body is
parsed, before the upstream call: sets the cycle's kind, rule, turn, conversation and client),
for a continuation :meth:`TurnTracker.reconcile` (right after, also before the upstream
call: reads the conversation's latest turn from the database, see below) and
:meth:`TurnTracker.recorded` (as the cycle is written: notes the call's end and returns
the turn's row, recomputed from its calls, as an upsert committed in the cycle's own
transaction; the row is built in the writer thread). The turn rows are what
:func:`flowtrial.study.turns.rebuild_turns` would compute from the cycles.

One tracker per proxy process. With several proxies (or ``--workers``) sharing a database,
a continuation may reach another process than the calls before it. So every continuation
(with a conversation key) reads the participant's latest recorded turn in its conversation:
if that turn is still waiting for a tool result (its last call asked for tools, within the
idle limit) the continuation joins it, and the turn's calls recorded by other processes are
merged in, so the turn row this process writes holds them all. A call is recorded before
its stream ends, so the client cannot continue before the read can see it. Left to memory:
side calls and retries are filed by what this process has seen.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from flowtrial.study.storage import LazyRow, WriteBatch
from flowtrial.study.turn_revision import REVISED_FROM, REVISED_RULE, revisable
from flowtrial.study.turns import (
    Call,
    OpenTurn,
    TurnAssigner,
    TurnRules,
    latest_recorded_turn,
    summarize_turn,
    turn_id_for,
)

from ..proxy.protocols import RequestInfo, read_view
from .classify import Context, classify, features_of
from .clients import client_identity
from .followups import input_key

__all__ = ["PERSON_EVENT_KINDS", "TurnTracker", "turn_rules"]

#: Event kinds that only a person's action makes (the typing-speed rule's "sign the person
#: acted"; ``turn_start`` is an agent's telemetry of a typed prompt).
PERSON_EVENT_KINDS = frozenset({"accept", "reject", "partial_accept", "edit", "focus_in",
                                "focus_out", "afk_end", "task_start", "task_end",
                                "turn_start"})

_MAX_RESPONSE_IDS = 10_000
log = logging.getLogger("flowtrial.proxy")


class _Rec(Protocol):  # what the tracker reads and sets on a cycle record
    id: str
    participant_id: str
    protocol: str
    model: str | None
    t_request_ns: int
    request_kind: str | None
    kind_rule: str | None
    turn_id: str | None
    conversation_key: str | None
    client: str | None
    client_sdk: str | None
    input_key: str | None
    offers_tools: bool | None
    revised_from: str | None


@dataclass
class _Lone:
    """A ``human`` request by default (``new_input``) without tools: a later request with
    the same new user text may revise it (study/turn_revision.py)."""

    rec: _Rec
    t_ns: int  # wall clock
    turn_id: str
    recorded: bool = False


class TurnTracker:
    """Per-process turn state: the assigner, each open turn's calls, response chains."""

    def __init__(self, mono_anchor_ns: int, wall_anchor_ns: int,
                 rules: TurnRules | None = None, database: Any = None,
                 secret: bytes | None = None) -> None:
        self.assigner = TurnAssigner(rules)
        self.secret = secret  # keys conversation hashes (the study's, from its database)
        self.database = database  # where other processes' calls are read (None: memory only)
        self._offset = wall_anchor_ns - mono_anchor_ns
        self._calls: dict[str, dict[str, Call]] = {}  # turn id -> cycle id -> call
        # Responses id -> (participant, conversation key): whose it is, what it continues
        self._chains: dict[str, tuple[str, str | None]] = {}
        self._since_prune = 0
        self._lone: dict[str, list[_Lone]] = {}  # participant -> revisable requests
        self._lone_by_cycle: dict[str, _Lone] = {}
        self._pending: dict[str, list[WriteBatch]] = {}  # cycle id -> revision writes

    def person_acted(self, participant_id: str, wall_ns: int) -> None:
        """Something showed the person acted (an event from their client or page): a
        user-role request after it is theirs whatever the typing-speed rule says."""
        self.assigner.person_acted(participant_id, wall_ns)

    def note_events(self, participant_id: str, rows: list[dict[str, Any]]) -> None:
        """Events just recorded (``events`` rows): those a person's action makes (an edit,
        an accept, a focus change, a prompt an agent reported) count for
        :meth:`person_acted`."""
        for row in rows:
            if row.get("kind") in PERSON_EVENT_KINDS and isinstance(row.get("ts_ns"), int):
                self.person_acted(participant_id, row["ts_ns"])

    # ------------------------------------------------------------------ hooks
    def arrive(self, rec: _Rec, body: Mapping[str, Any], raw: bytes,
               headers: Mapping[str, str]) -> OpenTurn | None:
        """Classify the request and file it into a turn (sets the record's fields). For a
        continuation, the turn it would join were it another process's, to pass to
        :meth:`reconcile` before the upstream call (None: nothing to check)."""
        obj = dict(body)
        return self.arrive_view(rec, read_view(rec.protocol, obj),
                                input_key(rec.protocol, obj), raw, headers)

    def arrive_view(self, rec: _Rec, view: RequestInfo, new_input: str | None, raw: bytes,
                    headers: Mapping[str, str]) -> OpenTurn | None:
        """:meth:`arrive` for a body already read (its view and input key: a large body is
        read off the loop, :mod:`flowtrial.instrumentation.proxy.body_parser`)."""
        f = features_of(rec.protocol, view, self.secret)
        now = rec.t_request_ns + self._offset
        pid = rec.participant_id
        identity = client_identity(headers.get("user-agent"), headers)
        client = identity.agent
        conversation = f.conversation_key
        if f.previous_response_id is not None:  # a Responses chain keeps its conversation
            chain = self._chains.get(f.previous_response_id)
            conversation = (chain[1] if chain and chain[0] == pid else None) or _hash(
                f.previous_response_id)
        request_key = f"{len(raw)}:{hash(raw):x}"  # in memory only: the fast built-in hash
        latest = self.assigner.latest(pid, now)
        gap = (self.assigner.answer_gap(pid, conversation, now) if f.ends == "user_text"
               else None)
        ctx = Context(
            repeat=self.assigner.repeat_of(pid, request_key, now),
            turn_open=latest is not None and not latest.closed,
            turn_conversation=latest.conversation_key if latest else None,
            turn_model=latest.model if latest else None,
            turn_offers_tools=latest.offers_tools if latest else False,
            turn_client=latest.client if latest else None,
            client=client,
            since_answer_s=gap[0] if gap else None,
            typing_window_s=self.assigner.rules.typing_window_s,
            person_acted=gap[2] if gap else False,
        )
        kind, rule = classify(replace(f, conversation_key=conversation), ctx)
        rec.request_kind, rec.kind_rule = kind, rule
        rec.conversation_key, rec.client, rec.client_sdk = conversation, client, identity.sdk
        rec.input_key, rec.offers_tools = new_input, f.offers_tools
        rec.turn_id = self.assigner.assign(
            pid, rec.id, kind, now, conversation_key=conversation, request_key=request_key,
            model=f.model, offers_tools=f.offers_tools, client=client,
            join=gap[1] if gap is not None and rule == "faster_than_typing" else None)
        if kind == "human" and rec.turn_id is not None:
            self._revise(rec, now)
            if rule == "new_input" and not f.offers_tools and new_input is not None:
                lone = _Lone(rec, now, rec.turn_id)
                self._lone.setdefault(pid, []).append(lone)
                self._lone_by_cycle[rec.id] = lone
        if kind != "continuation" or conversation is None or self.database is None:
            return None
        return OpenTurn("", conversation, f.model, f.offers_tools, client, now)

    async def foreign_response(self, pid: str, response_id: Any) -> bool:
        """Whether ``response_id`` (a request's ``previous_response_id``) is known to be
        another participant's response: remembered here, else recorded in the database.
        An id known to no one may be the participant's own still in flight (a WebSocket
        turn chains at once): the upstream judges it."""
        if not isinstance(response_id, str) or not response_id:
            return False
        chain = self._chains.get(response_id)
        if chain is not None:
            return chain[0] != pid
        if self.database is None:
            return False
        import asyncio

        from sqlalchemy import text

        database = self.database

        def owner() -> str | None:
            with database.engine.connect() as conn:
                return conn.execute(text(
                    "SELECT participant_id FROM cycles WHERE upstream_response_id = :r "
                    "LIMIT 1"), {"r": response_id}).scalar()

        found = await asyncio.to_thread(owner)
        return found is not None and found != pid

    async def reconcile(self, rec: _Rec, turn: OpenTurn) -> None:
        """Join the continuation to its conversation's turn as recorded by any process, and
        merge that turn's recorded calls into this process's (see the module docstring)."""
        import asyncio

        assert rec.conversation_key is not None
        try:
            tid, calls = await asyncio.to_thread(latest_recorded_turn, self.database,
                                                 rec.participant_id, rec.conversation_key)
        except Exception:  # noqa: BLE001 - the answer goes on; `flowtrial turns` can mend
            log.warning("turns: could not read the turn of %s from the database", rec.id,
                        exc_info=True)
            return
        if tid is None or not calls:
            return
        last = calls[-1]
        now = rec.t_request_ns + self._offset
        ended = (last.t_end_ns if last.t_end_ns is not None else last.t_request_ns)
        idle = int(self.assigner.rules.idle_limit_s * 1e9)
        if last.final or now - (ended + last.offset_ns) > idle:
            return  # that turn is over: the continuation's own turn stands
        if tid != rec.turn_id:
            self.assigner.adopt(rec.participant_id, replace(
                turn, id=tid, last_activity_ns=max(ended + last.offset_ns, now)), rec.id)
            if rec.turn_id == turn_id_for(rec.id):  # the turn it had just started
                self._calls.pop(rec.turn_id, None)
            rec.turn_id = tid
        mine = self._calls.setdefault(tid, {})
        for c in calls:
            mine.setdefault(c.cycle_id, c)

    def recorded(self, rec: Any) -> list[WriteBatch]:
        """The cycle is about to be written: note its end, and return its turn's row (an
        upsert, built in the writer thread) and any revision of an earlier cycle this one
        decided (an update of its row, the delete of its turn's) to commit in the same
        transaction."""
        if getattr(rec, "request_kind", None) is None:
            return []
        if rec.upstream_response_id and rec.conversation_key is not None:
            if len(self._chains) >= _MAX_RESPONSE_IDS:
                self._chains.pop(next(iter(self._chains)))
            self._chains[rec.upstream_response_id] = (rec.participant_id,
                                                      rec.conversation_key)
        call = _call(rec, self._offset)
        self.assigner.ended(rec.participant_id, rec.turn_id, rec.request_kind, call.final,
                            (call.t_end_ns or rec.t_request_ns) + self._offset,
                            failed=rec.status != "ok")
        lone = self._lone_by_cycle.get(rec.id)
        if lone is not None:
            lone.recorded = True
        pending = self._pending.pop(rec.id, [])
        if rec.turn_id is None:
            return pending
        calls = self._calls.setdefault(rec.turn_id, {})
        calls[rec.id] = call
        self._prune()
        if not any(c.kind != "side" for c in calls.values()):
            return pending  # side calls alone make no turn (yet)
        from flowtrial.study.schema import Turn

        row = LazyRow(partial(summarize_turn, rec.turn_id, list(calls.values())))
        return [WriteBatch(Turn, row, upsert=True), *pending]

    def _revise(self, rec: _Rec, now: int) -> None:
        """A ``human`` request arrived: revise the newest lone earlier request it shows was
        a side call (study/turn_revision.py) into a side call of this request's turn."""
        pid = rec.participant_id
        window = self.assigner.rules.revise_window_s
        alive: list[_Lone] = []
        for lone in self._lone.get(pid, []):
            if now - lone.t_ns <= window * 1e9:
                alive.append(lone)
            else:
                self._lone_by_cycle.pop(lone.rec.id, None)
        for lone in reversed(alive):
            turn = self.assigner.turn(pid, lone.turn_id)
            e = lone.rec
            if turn is None or turn.calls != 1 or not revisable(
                    e.kind_rule, e.offers_tools, e.input_key, e.conversation_key, lone.t_ns,
                    rec.input_key, rec.conversation_key, now, window):
                continue
            self.assigner.drop(pid, lone.turn_id)
            e.request_kind, e.kind_rule, e.revised_from = "side", REVISED_RULE, REVISED_FROM
            e.turn_id = rec.turn_id
            moved = self._calls.pop(lone.turn_id, {})
            for c in moved.values():
                c.kind = "side"
            self._calls.setdefault(rec.turn_id or "", {}).update(moved)
            if lone.recorded:  # its row and its turn's are written: mend them
                from flowtrial.study.schema import Cycle, Turn

                self._pending.setdefault(rec.id, []).extend([
                    WriteBatch(Cycle, [{"id": e.id, "request_kind": "side",
                                        "kind_rule": REVISED_RULE,
                                        "revised_from": REVISED_FROM,
                                        "turn_id": rec.turn_id}], update=True),
                    WriteBatch(Turn, [{"id": lone.turn_id}], delete=True)])
            alive.remove(lone)
            self._lone_by_cycle.pop(e.id, None)
            break
        self._lone[pid] = alive

    # ------------------------------------------------------------------ internals
    def _prune(self) -> None:
        """Forget the calls of turns the assigner no longer holds (idle past the limit);
        every 256 recorded cycles, so the sweep costs O(1) per cycle."""
        self._since_prune += 1
        if self._since_prune < 256:
            return
        self._since_prune = 0
        now = time.monotonic_ns() + self._offset
        live: set[str] = set()
        for pid in {c.participant_id for calls in self._calls.values()
                    for c in calls.values()}:
            live |= self.assigner.held(pid, now)
        for tid in [t for t in self._calls if t not in live]:
            del self._calls[tid]
        window = self.assigner.rules.revise_window_s * 1e9
        for pid, lones in list(self._lone.items()):
            keep = [lone for lone in lones if now - lone.t_ns <= window]
            for lone in lones:
                if lone not in keep:
                    self._lone_by_cycle.pop(lone.rec.id, None)
            if keep:
                self._lone[pid] = keep
            else:
                del self._lone[pid]


def turn_rules(config: Any) -> TurnRules:
    """The turn windows a study sets (``[study] idle_limit_s``, ``typing_window_s``). The
    typing window is a person's real time: with time compressed (``time_scale``) it is that
    much shorter on the proxy's clock."""
    study = config.study
    return TurnRules(idle_limit_s=study.idle_limit_s,
                     typing_window_s=study.typing_window_s / study.time_scale)


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _call(rec: Any, offset: int) -> Call:
    target = getattr(rec, "target", None)
    end = rec.t_last_sent_ns if rec.t_last_sent_ns is not None else rec.t_done_ns
    return Call(
        cycle_id=rec.id, participant_id=rec.participant_id, kind=rec.request_kind,
        t_request_ns=rec.t_request_ns, t_end_ns=end, offset_ns=offset,
        t_upstream_last_ns=rec.t_upstream_last_ns, t_last_sent_ns=rec.t_last_sent_ns,
        shaped=target is not None,
        tool_calls=rec.tool_calls, status=rec.status, arm=rec.arm, period=rec.period,
        task_id=rec.task_id, protocol=rec.protocol, client=rec.client,
        conversation_key=rec.conversation_key, mono_anchor_ns=rec.mono_anchor_ns,
        wall_anchor_ns=rec.wall_anchor_ns, simulated=rec.simulated, kind_rule=rec.kind_rule,
        input_key=rec.input_key, offers_tools=rec.offers_tools, turn_id=rec.turn_id,
    )
