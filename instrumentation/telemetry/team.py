"""The OTLP receiver's team side (``design = "observe"``): a batch sent with the team token
is split by person. Each record's identity (resource or record attributes: the first of
:data:`IDENTITY_KEYS`) becomes the person's pseudonym (:func:`flowtrial.study.team.pseudonym`);
the identity attributes are removed from the record before anything maps or stores it.
A record with no identity is dropped and counted (OTLP's ``partial_success``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flowtrial.study.storage import Database
from flowtrial.study.team import TeamAuth, ensure_members, load_team_auth

from .otlp import OtelRecord

__all__ = ["DISPLAY_NAME_KEY", "IDENTITY_KEYS", "bearer", "refresh_turns", "split_by_person",
           "strip_identity", "team_auth", "team_rows"]

#: Where agents put who is using them: Claude Code (``user.email``, ``user.account_uuid``),
#: Codex (``user.email``, ``user.account_id``), Gemini CLI (``user.email``,
#: ``installation.id``), or the team's own ``OTEL_RESOURCE_ATTRIBUTES=flowtrial.person=…``.
IDENTITY_KEYS = ("flowtrial.person", "user.email", "user.account_uuid", "user.account_id",
                 "user.id", "enduser.id", "installation.id")
#: Opt-in: ``OTEL_RESOURCE_ATTRIBUTES=flowtrial.display_name=Ada`` shows "Ada" in the team view.
DISPLAY_NAME_KEY = "flowtrial.display_name"
_DROP = frozenset(IDENTITY_KEYS) | {DISPLAY_NAME_KEY, "organization.id", "user.name",
                                     "host.name", "enduser.email"}


def bearer(headers: Mapping[str, str]) -> str | None:
    """The ``Authorization: Bearer …`` token, if any."""
    value = headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _identity(rec: OtelRecord) -> str | None:
    for attrs in (rec.attributes, rec.resource):
        for key in IDENTITY_KEYS:
            v = attrs.get(key)
            if isinstance(v, str) and v.strip():
                return v
    return None


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k not in _DROP}


def strip_identity(records: Iterable[OtelRecord]) -> list[OtelRecord]:
    """``records`` without their identity attributes (what a team study never stores)."""
    return [dataclasses.replace(r, attributes=_clean(r.attributes), resource=_clean(r.resource))
            for r in records]


def split_by_person(auth: TeamAuth, records: Iterable[OtelRecord]
                    ) -> tuple[dict[str, list[OtelRecord]], dict[str, str | None], int]:
    """(pseudonym → its records without identity attributes, pseudonym → opted-in display
    name or None, records dropped for having no identity)."""
    from flowtrial.study.team import pseudonym

    out: dict[str, list[OtelRecord]] = {}
    names: dict[str, str | None] = {}
    dropped = 0
    for rec in records:
        who = _identity(rec)
        if who is None:
            dropped += 1
            continue
        pid = pseudonym(auth.secret, who)
        name = rec.resource.get(DISPLAY_NAME_KEY) or rec.attributes.get(DISPLAY_NAME_KEY)
        if isinstance(name, str) and name.strip():
            names[pid] = name.strip()[:64]
        else:
            names.setdefault(pid, None)
        out.setdefault(pid, []).extend(strip_identity([rec]))
    return out, names, dropped


def team_auth(database: Database, headers: Mapping[str, str]) -> TeamAuth | None:
    """The study's team credentials when ``headers`` carry its team token, else None."""
    token = bearer(headers)
    if token is None:
        return None
    auth = load_team_auth(database)
    return auth if auth is not None and auth.verify(token) else None


def team_rows(database: Database, auth: TeamAuth, records: Iterable[OtelRecord], full: bool,
              now_ns: int, received_at: datetime) -> tuple[list[dict[str, Any]], int]:
    """The ``events`` rows of a team batch: split by person (new people enrolled under
    their pseudonym), then mapped and linked per person like a participant's batch; and
    how many records were dropped for naming no one."""
    from .ingest import prepare_rows

    by_person, names, dropped = split_by_person(auth, records)
    ensure_members(database, names)
    rows: list[dict[str, Any]] = []
    for pid, recs in by_person.items():
        rows += [r for r in prepare_rows(database, pid, recs, full, now_ns, received_at)
                 if not _per_token(r)]
    return rows, dropped


#: OTLP's partial success: which field counts a signal's rejected items.
REJECTED_FIELD = {"logs": "rejected_log_records", "traces": "rejected_spans",
                  "metrics": "rejected_data_points"}
NO_IDENTITY = ("records naming no person were dropped: set user.email, or "
               "OTEL_RESOURCE_ATTRIBUTES=flowtrial.person=<id>, in the agent")


def partial_success(response: Any, signal: str, dropped: int) -> Any:
    """``response`` with OTLP's ``partial_success`` when records were ``dropped``."""
    if dropped:
        setattr(response.partial_success, REJECTED_FIELD[signal], dropped)
        response.partial_success.error_message = NO_IDENTITY
    return response


def _per_token(row: dict[str, Any]) -> bool:
    """Codex's record of every streamed event (one per token): a team study keeps only the
    mapped ones (the stream's end is ``answer_end``), or a year of a team is mostly these."""
    return row["kind"] == "custom" and '"name": "codex.sse_event"' in (row["payload_json"] or "")


def refresh_turns(database: Database, rows: list[dict[str, Any]]) -> None:
    """Rebuild the turns (``team_turns``) of each person in ``rows``, from the turn open at
    their earliest record in it."""
    from flowtrial.study.team_turns import refresh_team_turns

    since: dict[str, int] = {}
    for r in rows:
        pid = str(r["participant_id"])
        since[pid] = min(since.get(pid, r["ts_ns"]), r["ts_ns"])
    from sqlalchemy.exc import IntegrityError

    for pid, ts in since.items():
        for attempt in range(3):  # a concurrent batch of the same person rebuilt them first
            try:
                with database.engine.begin() as conn:
                    refresh_team_turns(conn, pid, ts)
                break
            except IntegrityError:
                if attempt == 2:
                    raise
