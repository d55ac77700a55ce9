"""Enrolling participants, their assignments, and finding them by API key."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import col

from . import keys
from .config import StudyConfig
from .errors import FlowtrialError
from .randomization import crossover_arms, parallel_arm
from .schema import Assignment, Participant
from .storage import Database, StorageError, utcnow

PER_PROMPT_ARM = "per_prompt"


class EnrollmentError(FlowtrialError):
    """A participant cannot be enrolled as asked."""


def validate_participant_id(pid: str) -> str:
    if not pid or len(pid) > 64 or not all(c.isalnum() or c in "-_." for c in pid):
        raise EnrollmentError(
            f"participant id {pid!r} is not valid: use 1-64 letters, digits, '-', '_' or '.' "
            "(a pseudonym, never a name or e-mail)"
        )
    return pid


def enroll(
    database: Database,
    config: StudyConfig,
    participant_id: str,
    *,
    consent_at: datetime | None = None,
    simulated: bool = False,
    working_apps: list[str] | None = None,
) -> tuple[Participant, str, list[Assignment]]:
    """Enroll one participant: make their key, assign arms. Returns the key in clear once."""
    validate_participant_id(participant_id)
    k = keys.new_key()
    now = utcnow()
    with database.session() as s:
        if s.get(Participant, participant_id) is not None:
            raise EnrollmentError(
                f"participant {participant_id!r} is already enrolled: pick another id "
                "(keys are shown only once; a lost key needs a new enrollment id)"
            )
        index = s.execute(select(func.count()).select_from(Participant)).scalar_one()
        p = Participant(
            id=participant_id,
            key_id=k.key_id,
            key_salt=k.salt,
            key_hash=k.key_hash,
            enrolled_index=index,
            # A study with a [consent] text asks for consent on the participant page.
            consent_at=consent_at or (None if config.consent is not None else now),
            created_at=now,
            simulated=simulated,
            working_apps_json=json.dumps(working_apps) if working_apps else None,
        )
        s.add(p)
        try:
            # Flush the participant first: assignments reference it by foreign key.
            s.flush()
        except IntegrityError as exc:  # a concurrent enrollment took the id
            raise EnrollmentError(f"participant {participant_id!r} is already enrolled") from exc
        assignments = _assignments(config, participant_id, index, now)
        s.add_all(assignments)
        s.commit()
    return p, k.key, assignments


def _assignments(
    config: StudyConfig, pid: str, index: int, now: datetime
) -> list[Assignment]:
    design = config.study.design
    seed = config.study.seed
    if design == "parallel":
        arm, block = parallel_arm(config.arms, seed, index)
        return [Assignment(participant_id=pid, period=0, arm=arm, block=block, created_at=now)]
    if design == "crossover":
        arms, seq_no, block = crossover_arms(config.arms, seed, index, config.study.periods)
        return [
            Assignment(
                participant_id=pid, period=i, arm=a, sequence=seq_no, block=block, created_at=now
            )
            for i, a in enumerate(arms)
        ]
    return []  # per_prompt: every request draws its own latency, recorded on the cycle


def participant_by_key(database: Database, key: str) -> Participant | None:
    """The participant whose key this is, or None (constant-time hash comparison)."""
    parts = keys.split_key(key)
    if parts is None:
        return None
    with database.session() as s:
        p = s.execute(
            select(Participant).where(col(Participant.key_id) == parts[0])
        ).scalars().first()
    if p is None or not keys.verify(key, p.key_salt, p.key_hash):
        return None
    return p


def assignments_for(database: Database, participant_id: str) -> dict[int, str]:
    """period -> arm for a participant."""
    with database.session() as s:
        rows = s.execute(
            select(Assignment).where(col(Assignment.participant_id) == participant_id)
        ).scalars().all()
    return {a.period: a.arm for a in rows}


def require_participant(database: Database, participant_id: str) -> Participant:
    with database.session() as s:
        p = s.get(Participant, participant_id)
    if p is None:
        raise StorageError(
            f"participant {participant_id!r} is not enrolled: enroll with `flowtrial enroll`"
        )
    return p
