"""What `flowtrial status` shows: enrollment, assignments and cycles per arm, SRM."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlmodel import col

from .participants import PER_PROMPT_ARM
from .randomization import SRMResult, srm_check, srm_not_applicable
from .schema import Assignment, Cycle, Event, Participant, Task
from .storage import Database


@dataclass
class StudyStatus:
    name: str
    design: str
    unit: str
    time_scale: float
    participants: int
    assignments: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, dict[str, int]] = field(default_factory=dict)  # arm -> status -> n
    events: int = 0
    tasks: int = 0
    srm: SRMResult | None = None
    #: Field studies: withdrawn participants (their rows kept), those whose consent is open
    #: in a study with a [consent] text, and requests refused before consent.
    withdrawn: int = 0
    awaiting_consent: int = 0
    refused_requests: int = 0
    srm_skipped: str | None = None  # why the check does not apply

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "design": self.design,
            "unit": self.unit,
            "time_scale": self.time_scale,
            "participants": self.participants,
            "assignments": self.assignments,
            "cycles": self.cycles,
            "events": self.events,
            "tasks": self.tasks,
            "srm": self.srm.to_dict() if self.srm else None,
            "withdrawn": self.withdrawn,
            "awaiting_consent": self.awaiting_consent,
            "refused_requests": self.refused_requests,
            "srm_skipped": self.srm_skipped,
        }


def study_status(database: Database) -> StudyStatus:
    """Counts that tell whether a study is running as planned."""
    config = database.config()
    with database.session() as s:
        n_part = s.execute(select(func.count()).select_from(Participant)).scalar_one()
        assign_rows = s.execute(
            select(col(Assignment.arm), func.count()).where(col(Assignment.period) == 0)
            .group_by(Assignment.arm)
        ).all()
        cycle_rows = s.execute(
            select(col(Cycle.arm), col(Cycle.status), func.count())
            .group_by(Cycle.arm, Cycle.status)
        ).all()
        n_events = s.execute(select(func.count()).select_from(Event)).scalar_one()
        n_tasks = s.execute(select(func.count()).select_from(Task)).scalar_one()
        pt = Participant.__table__  # type: ignore[attr-defined]
        withdrawn, open_consent, refused = s.execute(select(
            func.count(pt.c.withdrawn_at),
            func.count().filter(pt.c.consent_at.is_(None) & pt.c.withdrawn_at.is_(None)),
            func.coalesce(func.sum(pt.c.refused_requests), 0))).one()
    st = StudyStatus(
        name=config.study.name,
        design=config.study.design,
        unit=str(config.study.unit),
        time_scale=config.study.time_scale,
        participants=int(n_part),
        events=int(n_events),
        tasks=int(n_tasks),
        withdrawn=int(withdrawn),
        awaiting_consent=int(open_consent) if config.consent is not None else 0,
        refused_requests=int(refused),
    )
    per_prompt = config.study.design == "per_prompt"
    allocated = [a.name for a in config.allocated_arms]
    arm_names = [PER_PROMPT_ARM] if per_prompt else allocated
    st.assignments = dict.fromkeys(allocated, 0)
    for arm, n in assign_rows:
        st.assignments[arm] = int(n)
    for arm in arm_names:
        st.cycles.setdefault(arm, {})
    for arm, status, n in cycle_rows:
        st.cycles.setdefault(arm, {})[status] = int(n)
    planned = {a.name: a.weight for a in config.allocated_arms}
    st.srm_skipped = srm_not_applicable(config)
    if st.srm_skipped is None and config.study.design == "parallel":
        st.srm = srm_check(st.assignments, planned)
    elif st.srm_skipped is None:
        # Crossover: every period's arm should be used equally often across cycles.
        observed = {a: sum(st.cycles.get(a, {}).values()) for a in planned}
        st.srm = srm_check(observed, dict.fromkeys(planned, 1.0))
    return st
