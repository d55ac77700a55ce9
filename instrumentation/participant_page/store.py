"""What the participant page reads and writes: tasks, the arm reveal, task events, answers.

Every state change is one transaction with a guard in its ``WHERE`` clause (forecasts only
while none are set, start only a planned task, end only a started one), and every event it
writes carries a ``dedupe_key``, so a form submitted twice (back button, double click)
changes nothing the second time. Events are ``task_start``/``task_end`` (payload
``{"task_id"}``; ``task_end`` adds ``status``) and ``custom`` for the forecast and the
questionnaire (payload ``{"page": "forecast" | "questionnaire", "task_id"}``), all with
source ``page`` and UTC epoch ns times.

The arm revealed is the one the proxy will use (``flowtrial.instrumentation.proxy.arms``):
``parallel`` — the participant's period-0 assignment; ``crossover`` — the assignment of the
task's period, where a task without a period gets the participant's next unused one (tasks in
the order they are revealed walk through the Williams sequence); ``per_prompt`` — none, the
latency is drawn per request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import and_, func, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from flowtrial.study.config import StudyConfig
from flowtrial.study.errors import FlowtrialError
from flowtrial.study.participants import PER_PROMPT_ARM, assignments_for
from flowtrial.study.questionnaire import Instrument
from flowtrial.study.schema import Event, QuestionnaireAnswer, Task
from flowtrial.study.storage import Database, insert_batch, utcnow
from flowtrial.study.storage import WriteBatch as _WriteBatch
from flowtrial.study.tasks import add_task

__all__ = ["PageError", "Reveal", "TaskView"]

SOURCE = "page"
#: A task's final outcome after review (METR): ``tasks.outcome``.
OUTCOMES = ("done", "abandoned", "failed_review")
_T = Task.__table__  # type: ignore[attr-defined]
_E = Event.__table__  # type: ignore[attr-defined]
_Q = QuestionnaireAnswer.__table__  # type: ignore[attr-defined]


class PageError(FlowtrialError):
    """A submission that cannot be carried out; the message is shown to the participant."""


@dataclass
class TaskView:
    id: int
    name: str
    description: str | None
    status: str
    period: int | None
    arm: str | None
    forecast_fast_s: float | None
    forecast_slow_s: float | None
    started_at_ns: int | None
    ended_at_ns: int | None
    answered: bool = False
    link: str | None = None
    post_review_s: float | None = None
    outcome: str | None = None

    @property
    def forecast_done(self) -> bool:
        return self.forecast_fast_s is not None and self.forecast_slow_s is not None

    @staticmethod
    def when(ns: int | None) -> str:
        if ns is None:
            return ""
        return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass
class Reveal:
    arm: str
    period: int | None


def _event(pid: str, task_id: int, kind: str, ts: int, tag: str, payload: dict[str, Any]
           ) -> dict[str, Any]:
    return {"participant_id": pid, "cycle_id": None, "kind": kind, "ts_ns": ts,
            "duration_s": None, "source": SOURCE,
            "payload_json": json.dumps(payload), "dedupe_key": f"page:{pid}:task{task_id}:{tag}",
            "received_at": utcnow()}


def _insert_event_once(conn: Any, row: dict[str, Any]) -> bool:
    """Insert an event unless its dedupe key exists; True if inserted."""
    if conn.dialect.name == "sqlite":
        res = conn.execute(sqlite_insert(_E).on_conflict_do_nothing(), [row])
        return bool(res.rowcount)
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    res = conn.execute(pg_insert(_E).on_conflict_do_nothing(), [row])
    return bool(res.rowcount)


def list_tasks(database: Database, pid: str) -> list[TaskView]:
    with database.engine.connect() as conn:
        rows = conn.execute(select(_T).where(_T.c.participant_id == pid)
                            .order_by(_T.c.id)).mappings().all()
        answered = {r[0] for r in conn.execute(
            select(_Q.c.task_id).where(_Q.c.participant_id == pid).distinct())}
    return [_view(r, r["id"] in answered) for r in rows]


def _view(r: Any, answered: bool) -> TaskView:
    return TaskView(r["id"], r["name"], r["description"], r["status"], r["period"], r["arm"],
                    r["forecast_fast_s"], r["forecast_slow_s"], r["started_at_ns"],
                    r["ended_at_ns"], answered, r["link"], r["post_review_s"], r["outcome"])


def get_task(database: Database, pid: str, task_id: int) -> TaskView:
    with database.engine.connect() as conn:
        r = conn.execute(select(_T).where(and_(_T.c.id == task_id,
                                               _T.c.participant_id == pid))).mappings().first()
        if r is None:
            raise PageError("no such task")
        answered = conn.execute(select(func.count()).select_from(_Q).where(
            and_(_Q.c.participant_id == pid, _Q.c.task_id == task_id))).scalar_one() > 0
    return _view(r, answered)


def create_task(database: Database, pid: str, name: str, description: str | None) -> int:
    name = name.strip()
    if not name or len(name) > 200:
        raise PageError("give the task a name (at most 200 characters)")
    if description is not None and len(description) > 4000:
        raise PageError("the description may have at most 4000 characters")
    try:
        return add_task(database, pid, name, description=(description or "").strip() or None)
    except IntegrityError:
        raise PageError(f"you already have a task named {name!r}: pick another name") from None


def _reveal(conn: Any, database: Database, config: StudyConfig, pid: str, task: Any
            ) -> Reveal:
    design = config.study.design
    if design == "per_prompt":
        return Reveal(PER_PROMPT_ARM, task["period"])
    assignments = assignments_for(database, pid)
    if design == "parallel":
        if 0 not in assignments:
            raise PageError("you have no arm assignment: ask the researcher")
        return Reveal(assignments[0], 0)
    period = task["period"]
    if period is None:
        used = conn.execute(select(func.count()).select_from(_T).where(and_(
            _T.c.participant_id == pid, _T.c.period.is_not(None)))).scalar_one()
        period = int(used)
    if period in assignments:
        return Reveal(assignments[period], period)
    if task["arm"]:
        return Reveal(task["arm"], period)
    raise PageError(f"all {len(assignments)} periods of your schedule are used: ask the "
                    "researcher before starting another task")


def submit_forecast(database: Database, config: StudyConfig, pid: str, task_id: int,
                    fast_s: float, slow_s: float) -> Reveal:
    """Store both forecasts and fix the task's arm and period (once)."""
    for v in (fast_s, slow_s):
        if not (0 < v <= 1e6):
            raise PageError("enter both forecasts as minutes greater than 0")
    now = time.time_ns()
    with database.engine.begin() as conn:
        task = conn.execute(select(_T).where(and_(_T.c.id == task_id,
                                                  _T.c.participant_id == pid))
                            ).mappings().first()
        if task is None:
            raise PageError("no such task")
        if task["forecast_fast_s"] is not None or task["forecast_slow_s"] is not None:
            raise PageError("your forecasts for this task are already recorded")
        if task["status"] != "planned":
            raise PageError("forecasts can only be entered before the task starts")
        rev = _reveal(conn, database, config, pid, task)
        n = conn.execute(update(_T).where(and_(
            _T.c.id == task_id, _T.c.participant_id == pid, _T.c.forecast_fast_s.is_(None),
            _T.c.forecast_slow_s.is_(None), _T.c.status == "planned",
        )).values(forecast_fast_s=fast_s, forecast_slow_s=slow_s, arm=rev.arm,
                  period=rev.period)).rowcount
        if n != 1:
            raise PageError("your forecasts for this task are already recorded")
        _insert_event_once(conn, _event(pid, task_id, "custom", now, "forecast",
                                        {"page": "forecast", "task_id": task_id}))
    return rev


def start_task(database: Database, pid: str, task_id: int) -> None:
    now = time.time_ns()
    with database.engine.begin() as conn:
        other = conn.execute(select(_T.c.name).where(and_(
            _T.c.participant_id == pid, _T.c.status == "started", _T.c.id != task_id))).first()
        if other is not None:
            raise PageError(f"end your task {other[0]!r} before starting another")
        n = conn.execute(update(_T).where(and_(
            _T.c.id == task_id, _T.c.participant_id == pid, _T.c.status == "planned",
            _T.c.forecast_fast_s.is_not(None), _T.c.arm.is_not(None),
        )).values(status="started", started_at_ns=now)).rowcount
        if n == 1:
            _insert_event_once(conn, _event(pid, task_id, "task_start", now, "task_start",
                                            {"task_id": task_id}))
            return
    task = get_task(database, pid, task_id)
    if task.status == "planned":
        raise PageError("enter your forecasts first")
    # Started or ended already (a second click): nothing to do.


def clean_link(raw: str | None) -> str | None:
    """The task's pull request or issue URL (http/https, at most 500 characters) or None."""
    link = (raw or "").strip()
    if not link:
        return None
    parts = urlsplit(link)
    if parts.scheme not in ("http", "https") or not parts.netloc or len(link) > 500 or any(
            c.isspace() for c in link):
        raise PageError("the link must be the web address of the pull request or issue "
                        "(https://…, at most 500 characters)")
    return link


def end_task(database: Database, pid: str, task_id: int, status: str,
             link: str | None = None) -> None:
    if status not in ("done", "abandoned"):
        raise PageError("a task ends as done or abandoned")
    url = clean_link(link)
    now = time.time_ns()
    with database.engine.begin() as conn:
        values: dict[str, Any] = {"status": status, "ended_at_ns": now, "outcome": status}
        if url is not None:
            values["link"] = url
        n = conn.execute(update(_T).where(and_(
            _T.c.id == task_id, _T.c.participant_id == pid, _T.c.status == "started",
        )).values(**values)).rowcount
        if n == 1:
            _insert_event_once(conn, _event(pid, task_id, "task_end", now, "task_end",
                                            {"task_id": task_id, "status": status}))
            return
    task = get_task(database, pid, task_id)
    if task.status == "planned":
        raise PageError("this task has not started")


def record_review(database: Database, pid: str, task_id: int, post_review_s: float,
                  outcome: str, link: str | None) -> None:
    """After review (METR's outcome): the implementation time it took and the final
    outcome (done | abandoned | failed_review) of an ended task; may be corrected."""
    if outcome not in OUTCOMES:
        raise PageError("the outcome is done, abandoned or failed review")
    if not (0 <= post_review_s <= 1e7):
        raise PageError("enter the time after review in minutes (0 if none)")
    url = clean_link(link)
    with database.engine.begin() as conn:
        values: dict[str, Any] = {"post_review_s": post_review_s, "outcome": outcome}
        if url is not None:
            values["link"] = url
        n = conn.execute(update(_T).where(and_(
            _T.c.id == task_id, _T.c.participant_id == pid,
            _T.c.status.in_(("done", "abandoned")))).values(**values)).rowcount
    if n != 1:
        raise PageError("the review's outcome is entered after the task has ended")


def parse_answers(instruments: list[Instrument], form: dict[str, str]
                  ) -> list[tuple[str, str, float]]:
    """(instrument, item, value) for every item, or PageError naming the first missing one."""
    out = []
    for ins in instruments:
        allowed = set(ins.points)
        for item in ins.items:
            raw = form.get(f"{ins.name}.{item.id}", "")
            try:
                v = int(raw)
            except ValueError:
                raise PageError(f"please answer: {item.text}") from None
            if v not in allowed:
                raise PageError(f"please answer: {item.text}")
            out.append((ins.name, item.id, float(v)))
    return out


def submit_answers(database: Database, pid: str, task_id: int,
                   answers: list[tuple[str, str, float]]) -> bool:
    """Store the questionnaire of an ended task once; False if it was already stored."""
    now_ns = time.time_ns()
    now = utcnow()
    with database.engine.begin() as conn:
        task = conn.execute(select(_T.c.status).where(and_(
            _T.c.id == task_id, _T.c.participant_id == pid))).first()
        if task is None:
            raise PageError("no such task")
        if task[0] not in ("done", "abandoned"):
            raise PageError("the questionnaire comes after the task has ended")
        if not _insert_event_once(conn, _event(pid, task_id, "custom", now_ns,
                                               "questionnaire",
                                               {"page": "questionnaire", "task_id": task_id})):
            return False
        insert_batch(conn, _WriteBatch(QuestionnaireAnswer, [
            {"participant_id": pid, "task_id": task_id, "instrument": ins, "item": item,
             "value": v, "answered_at": now} for ins, item, v in answers]))
    return True


def _logout_key(pid: str, nonce: str) -> str:
    return f"page:{pid}:logout:{nonce}"


def revoke_session(database: Database, pid: str, nonce: str) -> None:
    """Record a logout (an event ``logout`` whose dedupe key names the session): the
    session's cookie is refused from now on, by every worker, across restarts."""
    row = {"participant_id": pid, "cycle_id": None, "kind": "logout", "ts_ns": time.time_ns(),
           "duration_s": None, "source": SOURCE, "payload_json": None,
           "dedupe_key": _logout_key(pid, nonce), "received_at": utcnow()}
    with database.engine.begin() as conn:
        _insert_event_once(conn, row)


def session_revoked(conn: Any, pid: str, nonce: str) -> bool:
    """Whether the session with ``nonce`` was logged out (indexed: dedupe_key is unique)."""
    found = conn.execute(select(_E.c.id).where(_E.c.dedupe_key == _logout_key(pid, nonce)))
    return found.first() is not None
