"""A participant's consent and withdrawal (docs/researchers/field-study.md).

Consent: a study with a ``[consent]`` text records nothing of a participant until they agree
to it on the participant page (``participants.consent_at`` and ``consent_version``); the
proxy refuses their requests meanwhile and only counts them (``refused_requests``).
Withdrawal: ``withdrawn_at`` is set and the proxy refuses their requests from then on; with
deletion every row of theirs in every table goes in one transaction. Either leaves one line in
``audit`` naming the action, the participant id and row counts, never content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Table, delete, or_, select, update

from .config import StudyConfig
from .errors import FlowtrialError
from .schema import TABLES, Audit, Cycle, Participant, Persistence
from .storage import Database, utcnow

__all__ = ["ConsentError", "Standing", "add_refusals", "deletion_counts", "give_consent",
           "standing_of", "withdraw"]

_P = Participant.__table__  # type: ignore[attr-defined]
_A = Audit.__table__  # type: ignore[attr-defined]


class ConsentError(FlowtrialError):
    """Consent or withdrawal cannot be recorded as asked."""


@dataclass(frozen=True)
class Standing:
    """Whether the proxy may record a participant, and if not why (a ``code`` for the wire)."""

    may_record: bool
    code: str | None = None

    @property
    def message(self) -> str:
        if self.code == "consent_required":
            return ("flowtrial: you have not given your consent to this study yet: open the "
                    "participant page (/flowtrial/participant/), log in with your key and "
                    "read and accept the consent text; until then nothing is recorded")
        if self.code == "participant_withdrawn":
            return ("flowtrial: you have withdrawn from this study, so the proxy no longer "
                    "serves or records your requests")
        return ""


RECORDING = Standing(True)


def standing(config: StudyConfig, consent_at: object, withdrawn_at: object) -> Standing:
    if withdrawn_at is not None:
        return Standing(False, "participant_withdrawn")
    if config.consent is not None and consent_at is None:
        return Standing(False, "consent_required")
    return RECORDING


def standing_of(database: Database, config: StudyConfig, pid: str) -> Standing:
    with database.engine.connect() as conn:
        row = conn.execute(select(_P.c.consent_at, _P.c.withdrawn_at)
                           .where(_P.c.id == pid)).first()
    if row is None:
        return Standing(False, "participant_withdrawn")
    return standing(config, row[0], row[1])


def not_recording(database: Database, config: StudyConfig) -> dict[str, str]:
    """Participant id → refusal code of everyone the proxy must not record (one query)."""
    with database.engine.connect() as conn:
        rows = conn.execute(select(_P.c.id, _P.c.consent_at, _P.c.withdrawn_at).where(
            or_(_P.c.withdrawn_at.is_not(None), _P.c.consent_at.is_(None)))).all()
    out = {}
    for pid, consent_at, withdrawn_at in rows:
        s = standing(config, consent_at, withdrawn_at)
        if s.code is not None:
            out[pid] = s.code
    return out


def existing_ids(database: Database, ids: set[str]) -> set[str]:
    """Which of ``ids`` are still enrolled (their rows not deleted)."""
    with database.engine.connect() as conn:
        return {r[0] for r in conn.execute(select(_P.c.id).where(_P.c.id.in_(list(ids))))}


def add_refusals(database: Database, counts: Mapping[str, int]) -> None:
    """Add refused requests to each participant's count (the only trace they leave)."""
    if not counts:
        return
    with database.engine.begin() as conn:
        for pid, n in counts.items():
            conn.execute(update(_P).where(_P.c.id == pid).values(
                refused_requests=_P.c.refused_requests + n))


def _audit(conn: Connection, action: str, pid: str, detail: dict[str, object]) -> None:
    conn.execute(_A.insert().values(at=utcnow(), action=action, participant_id=pid,
                                    detail_json=json.dumps(detail, sort_keys=True)))


def give_consent(database: Database, config: StudyConfig, pid: str, version: str) -> bool:
    """Record consent to the study's current text; False if it was already recorded."""
    if config.consent is None:
        raise ConsentError("this study has no [consent] section: there is nothing to agree to")
    if version != config.consent.version:
        raise ConsentError(f"the consent text changed (now version {config.consent.version}):"
                           " reload the page and read it again")
    with database.engine.begin() as conn:
        n = conn.execute(update(_P).where(
            _P.c.id == pid, _P.c.consent_at.is_(None), _P.c.withdrawn_at.is_(None),
        ).values(consent_at=utcnow(), consent_version=version)).rowcount
    return n == 1


def _participant_tables() -> list[Table]:
    tables: list[Table] = [m.__table__ for m in TABLES]  # type: ignore[attr-defined]
    return [t for t in tables if "participant_id" in t.c and t.name != "audit"]


def deletion_counts(conn: Connection, pid: str) -> dict[str, int]:
    """Delete every row of ``pid`` (in the caller's transaction); rows deleted per table."""
    counts: dict[str, int] = {}
    cycles = select(Cycle.__table__.c.id).where(  # type: ignore[attr-defined]
        Cycle.__table__.c.participant_id == pid)  # type: ignore[attr-defined]
    per = Persistence.__table__  # type: ignore[attr-defined]
    counts["persistence"] = conn.execute(delete(per).where(or_(
        per.c.cycle_id.in_(cycles), per.c.checked_against.in_(cycles)))).rowcount
    for t in _participant_tables():
        counts[t.name] = conn.execute(delete(t).where(t.c.participant_id == pid)).rowcount
    counts["participants"] = conn.execute(delete(_P).where(_P.c.id == pid)).rowcount
    return {k: v for k, v in counts.items() if v}


def withdraw(database: Database, pid: str, *, delete_data: bool = False) -> dict[str, int]:
    """Withdraw ``pid``: nothing of theirs is recorded from now on; with ``delete_data`` every
    row of theirs is deleted too, in one transaction. Returns rows deleted per table."""
    with database.engine.begin() as conn:
        row = conn.execute(select(_P.c.withdrawn_at).where(_P.c.id == pid)).first()
        if row is None:
            raise ConsentError(f"participant {pid!r} is not enrolled (or their data was "
                               "already deleted): check the id with `flowtrial status`")
        if row[0] is None:
            conn.execute(update(_P).where(_P.c.id == pid).values(withdrawn_at=utcnow()))
            _audit(conn, "withdraw", pid, {})
        if not delete_data:
            return {}
        counts = deletion_counts(conn, pid)
        _audit(conn, "delete", pid, {"rows": counts})
    return counts
