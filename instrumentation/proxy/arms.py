"""Which latency a request gets: its arm (or per-prompt draw), resolved before the upstream
call so nothing touches the database between an upstream chunk and the client.

- ``parallel``: the participant's period-0 assignment (cached: assignments never change).
- ``crossover``: the arm of the period of the participant's currently started task (latest
  ``status = "started"`` row of ``tasks``), else period 0.
- ``per_prompt``: ``per_prompt_draw`` with the participant's next request index
  (:mod:`flowtrial.instrumentation.proxy.draw_indices`: claimed in blocks, never repeated across
  processes); the draw is recorded in ``draw_json``.

An arm without latency settings is unshaped pass-through (team mode).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass

from sqlalchemy import Engine, text

from flowtrial.study.config import StudyConfig
from flowtrial.study.participants import PER_PROMPT_ARM, assignments_for
from flowtrial.study.randomization import per_prompt_draw
from flowtrial.study.storage import Database, create_db_engine

from .draw_indices import DrawIndices
from .shaping import Target

__all__ = ["ArmResolver", "Resolution", "read_engine"]


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
        self.draw_indices = DrawIndices(self.engine)
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

    async def _assignments_for(self, pid: str) -> dict[int, str]:
        got = self._assignments.get(pid)
        if got is None:
            got = await asyncio.to_thread(assignments_for, self.database, pid)
            self._assignments[pid] = got
        return got

    async def start(self) -> None:
        """Claim per-prompt request indices for every enrolled participant up front."""
        if self.config.study.design == "per_prompt":
            await self.draw_indices.start()

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
            period: int | None = 0
            arm = None
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
                index = await self.draw_indices.next(pid)
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
