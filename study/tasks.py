"""Tasks: adding them, marking start and end, and linking the proxy's cycles to them.

A task's start and end are UTC epoch ns (like client events). The proxy does not know which
task a request belongs to, so :func:`link_cycles_to_tasks` fills ``cycles.task_id`` (and the
period, when missing) from the participant's task intervals afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import and_, select, update

from .schema import Cycle, Task
from .storage import Database, StorageError, utcnow


def add_task(
    database: Database,
    participant_id: str,
    name: str,
    *,
    arm: str | None = None,
    period: int | None = None,
    forecast_fast_s: float | None = None,
    forecast_slow_s: float | None = None,
    description: str | None = None,
    started_at_ns: int | None = None,
) -> int:
    """Add a task (status ``started`` when a start time is given, else ``planned``); its id."""
    task = Task(
        participant_id=participant_id,
        name=name,
        description=description,
        period=period,
        arm=arm,
        forecast_fast_s=forecast_fast_s,
        forecast_slow_s=forecast_slow_s,
        started_at_ns=started_at_ns,
        status="started" if started_at_ns is not None else "planned",
        created_at=utcnow(),
    )
    with database.session() as s:
        s.add(task)
        s.commit()
        assert task.id is not None
        return task.id


def end_task(database: Database, task_id: int, ended_at_ns: int, status: str = "done") -> None:
    """Mark a task ended (``done`` or ``abandoned``) at ``ended_at_ns``."""
    with database.engine.begin() as conn:
        n = conn.execute(
            update(Task.__table__)  # type: ignore[attr-defined]
            .where(Task.__table__.c.id == task_id)  # type: ignore[attr-defined]
            .values(ended_at_ns=ended_at_ns, status=status)
        ).rowcount
    if n != 1:
        raise StorageError(f"task {task_id} does not exist")


def link_cycles_to_tasks(
    database: Database, participant_ids: Iterable[str] | None = None
) -> int:
    """Set ``task_id`` (and a missing ``period``) of cycles whose request falls in a task.

    Only cycles without a task are touched; returns how many were linked.
    """
    tasks_t = Task.__table__  # type: ignore[attr-defined]
    cycles_t = Cycle.__table__  # type: ignore[attr-defined]
    query = select(tasks_t.c.id, tasks_t.c.participant_id, tasks_t.c.period,
                   tasks_t.c.started_at_ns, tasks_t.c.ended_at_ns).where(
        tasks_t.c.started_at_ns.is_not(None), tasks_t.c.ended_at_ns.is_not(None))
    if participant_ids is not None:
        query = query.where(tasks_t.c.participant_id.in_(list(participant_ids)))
    wall = cycles_t.c.wall_anchor_ns + cycles_t.c.t_request_ns - cycles_t.c.mono_anchor_ns
    linked = 0
    with database.engine.begin() as conn:
        for tid, pid, period, start, end in conn.execute(query).all():
            where = and_(cycles_t.c.participant_id == pid, cycles_t.c.task_id.is_(None),
                         wall >= start, wall <= end)
            values: dict[str, object] = {"task_id": tid}
            linked += conn.execute(update(cycles_t).where(where).values(**values)).rowcount
            if period is not None:
                conn.execute(update(cycles_t).where(
                    and_(cycles_t.c.task_id == tid, cycles_t.c.period.is_(None))
                ).values(period=period))
    return linked
