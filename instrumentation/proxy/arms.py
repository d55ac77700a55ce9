"""Which latency a request gets: its arm (or per-prompt draw), resolved before the upstream
call so nothing touches the database between an upstream chunk and the client.

- ``parallel``: the participant's period-0 assignment (cached: assignments never change).
- ``crossover``: the arm of the period of the participant's currently started task (latest
  ``status = "started"`` row of ``tasks``), else period 0.
- ``per_prompt``: ``per_prompt_draw`` with a per-participant request index; the draw is
  recorded in ``draw_json``. Each process claims blocks of :data:`INDEX_BLOCK` indices from
  the participant's ``draw_counters`` row in one transaction, so proxy restarts, the workers
  of one proxy and separate proxies on one database (a load balancer without sticky
  sessions) never repeat a draw. A claim never starts below the participant's highest
  recorded index (rows written without the counter, e.g. by ``flowtrial simulate``).

An arm without latency settings is unshaped pass-through (team mode).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass

from sqlalchemy import Engine, text

from instrumentation.proxy.shaping import Target
from study.config import StudyConfig
from study.participants import PER_PROMPT_ARM, assignments_for
from study.randomization import per_prompt_draw
from study.storage import Database, create_db_engine

__all__ = ["INDEX_BLOCK", "ArmResolver", "Resolution", "read_engine"]

#: Request indices a process claims at a time: a claim is one small write transaction (once
#: per 16 prompts of a participant); indices a process claimed but never used are skipped.
INDEX_BLOCK = 16


@dataclass(frozen=True, slots=True)
class Resolution:
    arm: str
    target: Target | None  # None: unshaped pass-through
    period: int | None = None
    task_id: int | None = None
    draw_json: str | None = None
    #: Where the task only labels the cycle (not crossover) its lookup runs alongside the
    #: upstream call instead of before it; await it before recording.
    task_lookup: asyncio.Future[int | None] | None = None


class NoAssignmentError(Exception):
    """The participant has no arm for this request (enrolled under another design?)."""


def read_engine(database: Database) -> Engine:
    """A pooled engine for the proxy's small reads (opening a SQLite connection per use costs
    more than the query)."""
    return create_db_engine(database.url, pooled=True)


_STARTED_TASK = text(
    "SELECT id, period, arm FROM tasks WHERE participant_id = :pid AND status = 'started' "
    "ORDER BY started_at_ns IS NULL, started_at_ns DESC, id DESC LIMIT 1"
)
_TaskRow = tuple[int, int | None, str | None]  # id, period, arm
_STARTED_TASK_SQL = (
    "SELECT id, period, arm FROM tasks WHERE participant_id = ? AND status = 'started' "
    "ORDER BY started_at_ns IS NULL, started_at_ns DESC, id DESC LIMIT 1"
)
_COUNT_CYCLES = text("SELECT count(*) FROM cycles WHERE participant_id = :pid")
_DRAWS = text("SELECT draw_json FROM cycles WHERE participant_id = :pid "
              "AND draw_json IS NOT NULL")
_COUNTER_ROW = text("INSERT INTO draw_counters (participant_id, next_index) VALUES (:pid, 0) "
                    "ON CONFLICT (participant_id) DO NOTHING")
# The UPDATE takes the row's write lock (PostgreSQL) / the database's (SQLite) until commit,
# so concurrent claims serialize and each reads back its own block's end.
_CLAIM = text("UPDATE draw_counters SET next_index = CASE WHEN next_index < :floor THEN :floor "
              "ELSE next_index END + :n WHERE participant_id = :pid")
_COUNTER = text("SELECT next_index FROM draw_counters WHERE participant_id = :pid")


def _readonly_sqlite(database: Database) -> sqlite3.Connection | None:
    """A read-only connection to a SQLite file database (None for other databases)."""
    if not database.url.startswith("sqlite:///"):
        return None
    path = database.url.removeprefix("sqlite:///")
    if not path or path == ":memory:":
        return None
    try:
        # A short busy timeout: this runs on the event loop, a busy database falls back to
        # a thread instead of stalling every stream.
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                               timeout=0.02)
    except sqlite3.Error:
        return None


def _request_index_of(draw_json: str) -> int | None:
    try:
        i = json.loads(draw_json).get("request_index")
    except (ValueError, AttributeError):
        return None
    return i if isinstance(i, int) else None


def _settle(fut: asyncio.Future[int | None], task: asyncio.Future[int | None]) -> None:
    if fut.done():
        return
    if task.cancelled():
        fut.cancel()
    elif task.exception() is not None:
        fut.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        fut.set_result(task.result())


class ArmResolver:
    """Resolves the arm and latency target of each request."""

    def __init__(self, database: Database, config: StudyConfig, engine: Engine | None = None):
        self.database = database
        self.config = config
        self.engine = engine if engine is not None else read_engine(database)
        self._ro = _readonly_sqlite(database)
        self.time_scale = config.study.time_scale
        self._assignments: dict[str, dict[int, str]] = {}
        self._indices: dict[str, tuple[int, int]] = {}  # pid -> (next, end) of its block
        self._floors: set[str] = set()  # participants whose recorded draws were checked
        self._index_locks: dict[str, asyncio.Lock] = {}
        self._targets = {
            a.name: Target.for_arm(a, self.time_scale) for a in config.arms
        }

    def _started_task(self, pid: str) -> _TaskRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(_STARTED_TASK, {"pid": pid}).first()
        return (int(row[0]), row[1], row[2]) if row else None

    def _started_task_id(self, pid: str) -> int | None:
        task = self._started_task(pid)
        return task[0] if task else None

    def _started_task_fast(self, pid: str) -> tuple[bool, _TaskRow | None]:
        """(done, task) from the read-only SQLite connection, on the event loop: an indexed
        read takes ~20 µs, a worker-thread hop ~1 ms of GIL contention on the critical path.
        Not done (use a thread) for other databases or if SQLite is busy."""
        if self._ro is None:
            return False, None
        try:
            row = self._ro.execute(_STARTED_TASK_SQL, (pid,)).fetchone()
        except sqlite3.Error:
            return False, None
        return True, ((int(row[0]), row[1], row[2]) if row else None)

    def _recorded_floor(self, pid: str) -> int:
        """Past every index recorded for ``pid`` (their draws say which), and past the count
        of their cycles."""
        with self.engine.connect() as conn:
            count = int(conn.execute(_COUNT_CYCLES, {"pid": pid}).scalar_one())
            used = [_request_index_of(d) for (d,) in conn.execute(_DRAWS, {"pid": pid})]
        return max([count, *(i + 1 for i in used if i is not None)])

    def _claim_block(self, pid: str) -> int:
        """Claim the next :data:`INDEX_BLOCK` request indices of ``pid``; the first one."""
        floor = 0
        if pid not in self._floors:  # once per process: the counter covers the rest
            floor = self._recorded_floor(pid)
        with self.engine.begin() as conn:
            conn.execute(_COUNTER_ROW, {"pid": pid})
            conn.execute(_CLAIM, {"pid": pid, "floor": floor, "n": INDEX_BLOCK})
            end = int(conn.execute(_COUNTER, {"pid": pid}).scalar_one())
        self._floors.add(pid)
        return end - INDEX_BLOCK

    async def _assignments_for(self, pid: str) -> dict[int, str]:
        got = self._assignments.get(pid)
        if got is None:
            got = await asyncio.to_thread(assignments_for, self.database, pid)
            self._assignments[pid] = got
        return got

    async def _request_index(self, pid: str) -> int:
        nxt, end = self._indices.get(pid, (0, 0))
        if nxt >= end:
            lock = self._index_locks.setdefault(pid, asyncio.Lock())
            async with lock:
                nxt, end = self._indices.get(pid, (0, 0))
                if nxt >= end:
                    nxt = await asyncio.to_thread(self._claim_block, pid)
                    end = nxt + INDEX_BLOCK
        self._indices[pid] = (nxt + 1, end)
        return nxt

    def _arm_target(self, arm: str) -> Target | None:
        if arm in self._targets:
            return self._targets[arm]
        return None  # an arm no longer in the study file: pass through, arm still recorded

    async def resolve(self, pid: str) -> Resolution:
        """The arm, target, period, task and draw for the next request of ``pid``."""
        design = self.config.study.design
        if design == "crossover":
            # The started task decides the arm: it must be read before the upstream call.
            done, task = self._started_task_fast(pid)
            if not done:
                task = await asyncio.to_thread(self._started_task, pid)
            assignments = await self._assignments_for(pid)
            period, arm = 0, None
            if task is not None:
                _, t_period, t_arm = task
                if t_period is not None and t_period in assignments:
                    period, arm = t_period, assignments[t_period]
                elif t_arm:
                    period, arm = t_period, t_arm
            arm = arm or self._period0(pid, assignments)
            return Resolution(arm, self._arm_target(arm), period, task[0] if task else None)
        # Elsewhere the task only labels the cycle: look it up alongside the upstream call
        # rather than before it (the read runs once the request is on its way upstream).
        lookup = self._task_label(pid)
        try:
            if design == "per_prompt":
                pp = self.config.per_prompt
                assert pp is not None  # the config validator guarantees it
                index = await self._request_index(pid)
                draw = per_prompt_draw(pp, self.config.study.seed, pid, index)
                target = Target.for_draw(pp, draw, self.time_scale)
                return Resolution(PER_PROMPT_ARM, target if target.shaped else None, None,
                                  None, json.dumps(draw, sort_keys=True), lookup)
            arm = self._period0(pid, await self._assignments_for(pid))
        except BaseException:
            lookup.cancel()
            raise
        return Resolution(arm, self._arm_target(arm), 0, None, None, lookup)

    def _task_label(self, pid: str) -> asyncio.Future[int | None]:
        """The participant's started task id, read on the next turn of the event loop (the
        fast read) or, when that cannot be done, in a thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()

        def read() -> None:
            if fut.done():  # the cycle was cancelled meanwhile
                return
            done, task = self._started_task_fast(pid)
            if done:
                fut.set_result(task[0] if task else None)
                return
            thread = asyncio.ensure_future(asyncio.to_thread(self._started_task_id, pid))
            thread.add_done_callback(lambda t: _settle(fut, t))

        loop.call_soon(read)
        return fut

    @staticmethod
    def _period0(pid: str, assignments: dict[int, str]) -> str:
        if 0 not in assignments:
            raise NoAssignmentError(
                f"participant {pid!r} has no arm assignment: enroll them with "
                "`flowtrial enroll` for this study"
            )
        return assignments[0]

    def close(self) -> None:
        if self._ro is not None:
            self._ro.close()
        self.engine.dispose()
