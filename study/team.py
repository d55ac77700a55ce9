"""Team studies (``design = "observe"``): one team token for everyone's telemetry, and each
person known only by a salted pseudonym of their identity.

The token is shown once (``flowtrial team-token``) and stored like a participant key
(``study.keys``: salted hash, in ``meta``). A person's pseudonym is
``t-`` + HMAC-SHA256(study secret, identity)[:16 hex]: the per-study secret (32 random bytes,
in ``meta``) makes the pseudonym useless for matching people across studies, and the raw
identity (an e-mail, an account id) is never written anywhere. Whoever holds both the
database *and* a candidate identity can confirm it (HMAC is deterministic); that is what
lets the same person keep one pseudonym across weeks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from . import keys
from .errors import FlowtrialError
from .schema import Participant
from .storage import Database, utcnow

__all__ = ["TeamAuth", "issue_team_token", "load_team_auth", "pseudonym"]

_SECRET = "team_pseudonym_secret"
_KEY = ("team_key_id", "team_key_salt", "team_key_hash")
_GET = text("SELECT key, value FROM meta WHERE key IN ('team_pseudonym_secret', "
            "'team_key_id', 'team_key_salt', 'team_key_hash')")


class TeamStudyError(FlowtrialError):
    """A team token asked of a study that is not an observe study."""


def pseudonym(secret: str, identity: str) -> str:
    """The person's stable pseudonym in this study (``t-`` + 16 hex digits)."""
    digest = hmac.new(bytes.fromhex(secret), identity.strip().lower().encode(),
                      hashlib.sha256).hexdigest()
    return f"t-{digest[:16]}"


@dataclass(frozen=True)
class TeamAuth:
    """What the receiver needs: the token's id, salt and hash, and the pseudonym secret."""

    key_id: str
    salt: str
    key_hash: str
    secret: str

    def verify(self, token: str) -> bool:
        parts = keys.split_key(token)
        return parts is not None and parts[0] == self.key_id and keys.verify(
            token, self.salt, self.key_hash)


def _set(conn: Connection, key: str, value: str) -> None:
    conn.execute(text("DELETE FROM meta WHERE key = :k"), {"k": key})
    conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, :v)"), {"k": key, "v": value})


def issue_team_token(database: Database) -> str:
    """A new team token (the previous one stops working); the pseudonym secret is made once
    and kept, so pseudonyms survive a token rotation."""
    design = database.config().study.design
    if design != "observe":
        raise TeamStudyError(f"this study's design is {design!r}: a team token is for "
                             "design = \"observe\" (a team's own work, no proxy)")
    new = keys.new_key()
    with database.engine.begin() as conn:
        have: dict[str, str] = {str(k): str(v) for k, v in conn.execute(_GET).all()}
        if _SECRET not in have:
            _set(conn, _SECRET, secrets.token_hex(32))
        for k, v in zip(_KEY, (new.key_id, new.salt, new.key_hash), strict=True):
            _set(conn, k, v)
    return new.key


def load_team_auth(database: Database) -> TeamAuth | None:
    """The study's team token and secret, or None (no token issued)."""
    with database.engine.connect() as conn:
        have: dict[str, str] = {str(k): str(v) for k, v in conn.execute(_GET).all()}
    if not all(k in have for k in (*_KEY, _SECRET)):
        return None
    return TeamAuth(have["team_key_id"], have["team_key_salt"], have["team_key_hash"],
                    have[_SECRET])


def ensure_members(database: Database, members: dict[str, str | None]) -> None:
    """Participant rows for new pseudonyms (no key: they cannot authenticate on their own),
    and the opted-in display names (``None`` leaves a name as it is)."""
    if not members:
        return
    ids = list(members)
    with database.engine.begin() as conn:
        known = set(conn.execute(select(Participant.id).where(  # type: ignore[call-overload]
            Participant.id.in_(ids))).scalars())  # type: ignore[attr-defined]
        n = int(conn.execute(select(func.count()).select_from(Participant)).scalar_one())
        table = Participant.__table__  # type: ignore[attr-defined]
        for pid in ids:
            name = members[pid]
            if pid not in known:
                n += 1
                try:  # another batch of the same new person may be enrolling them now
                    with conn.begin_nested():
                        conn.execute(table.insert().values(
                            id=pid, key_id=f"team-{pid}", key_salt="", key_hash="",
                            enrolled_index=n, created_at=utcnow(), simulated=False,
                            display_name=name))
                except IntegrityError:
                    pass
            elif name is not None:
                conn.execute(table.update().where(table.c.id == pid).values(display_name=name))
