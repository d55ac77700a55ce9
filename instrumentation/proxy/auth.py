"""Participant authentication: their own key is the API key the assistant sends.

The key arrives as ``Authorization: Bearer …`` (OpenAI clients), ``x-api-key`` (Anthropic
clients), ``x-goog-api-key`` or ``?key=`` (Gemini clients). Under pass-through credentials
(an upstream with ``credentials = "participant"``) those headers carry the person's own
provider credential instead, and the flowtrial key comes in ``x-flowtrial-key`` (a header
clients can add: Claude Code's ``ANTHROPIC_CUSTOM_HEADERS``, Codex's ``http_headers``) or
in a per-participant path prefix ``/p/<key>/…`` (clients that can only set a base URL;
:data:`PATH_KEY` in the ASGI scope, set by the app); :func:`identity_key` prefers them.

A verified key is cached in memory, so the salted-hash check and the database
lookup happen once per key and process, not on every request. Unknown keys are not cached
(a participant enrolled while the proxy runs is found on their first request).

Standing (docs/researchers/field-study.md): a participant who has not consented (in a study
with a ``[consent]`` text) or has withdrawn is refused with :meth:`Authenticator.refusal`, a
dictionary lookup. :meth:`Authenticator.watch` re-reads who may not be recorded every
``WATCH_S`` (so a withdrawal by ``flowtrial withdraw`` in another process takes effect within
it) and writes the pre-consent refusal counts, the only trace such requests leave; the
participant page updates this process at once through :meth:`Authenticator.note`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from flowtrial.study.config import StudyConfig
from flowtrial.study.participants import participant_by_key
from flowtrial.study.participation import Standing, add_refusals, not_recording, standing
from flowtrial.study.storage import Database

from .protocols import CREDENTIAL_HEADERS, PLAIN_KEY_HEADERS

__all__ = [
    "CREDENTIAL_HEADERS",
    "FLOWTRIAL_KEY_HEADER",
    "PATH_KEY",
    "WATCH_S",
    "Authenticator",
    "ParticipantInfo",
    "client_secrets",
    "identity_key",
    "key_from_headers",
    "separate_identity",
]

WATCH_S = 1.0
WITHDRAWN = Standing(False, "participant_withdrawn")


@dataclass(frozen=True, slots=True)
class ParticipantInfo:
    id: str
    simulated: bool = False


FLOWTRIAL_KEY_HEADER = "x-flowtrial-key"
PATH_KEY = "flowtrial.path_key"  # ASGI scope entry: the key of a ``/p/<key>/…`` prefix


def key_from_headers(headers: Mapping[str, str]) -> str | None:
    """The API key of a request, from ``Authorization: Bearer``, ``x-api-key`` or
    ``x-goog-api-key``."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    for name in PLAIN_KEY_HEADERS:
        key = headers.get(name)
        if key and key.strip():
            return key.strip()
    return None


def identity_key(headers: Mapping[str, str], path_key: str | None = None) -> str | None:
    """The flowtrial key that identifies the participant: ``x-flowtrial-key``, else the
    ``/p/<key>/`` path prefix, else the request's API key."""
    key = headers.get(FLOWTRIAL_KEY_HEADER)
    if key and key.strip():
        return key.strip()
    return path_key or key_from_headers(headers)


def separate_identity(headers: Mapping[str, str], path_key: str | None = None) -> bool:
    """Whether the participant is identified apart from the credential headers (so those
    are theirs to forward under pass-through)."""
    return bool(path_key) or bool((headers.get(FLOWTRIAL_KEY_HEADER) or "").strip())


def client_secrets(headers: Mapping[str, str], path_key: str | None = None) -> list[str]:
    """Every secret a request carries (flowtrial key, provider credentials): redacted from
    anything upstream-derived that is recorded or relayed."""
    out = [path_key, headers.get(FLOWTRIAL_KEY_HEADER), key_from_headers(headers)]
    out += [headers.get(h) for h in CREDENTIAL_HEADERS]
    return [s.strip() for s in out if s and s.strip()]


class Authenticator:
    """Finds the participant of a request; verified keys are served from memory."""

    def __init__(self, database: Database, config: StudyConfig | None = None) -> None:
        self.database = database
        self.config = config
        self._cache: dict[str, ParticipantInfo] = {}
        self._blocked: dict[str, Standing] = {}  # participant id -> why not recorded
        # Withdrawal is final, and a deleted participant has no row left to say so.
        self._withdrawn: set[str] = set()
        self._refused: dict[str, int] = {}  # pre-consent refusals not yet written

    def refusal(self, pid: str) -> Standing | None:
        """Why the proxy must not serve ``pid`` now (None: serve and record). No I/O."""
        if pid in self._withdrawn:
            return WITHDRAWN
        s = self._blocked.get(pid)
        if s is not None and s.code == "consent_required":
            self._refused[pid] = self._refused.get(pid, 0) + 1
        return s

    def withdrawn(self, pid: str) -> bool:
        """Whether ``pid`` withdrew (their answer in flight is then not recorded). No I/O."""
        return pid in self._withdrawn

    def note(self, pid: str, now: Standing) -> None:
        """Take a change of standing made in this process (the participant page) at once."""
        if now.may_record:
            self._blocked.pop(pid, None)
        elif now.code == "participant_withdrawn":
            self._withdrawn.add(pid)
            self._cache = {k: v for k, v in self._cache.items() if v.id != pid}
        else:
            self._blocked[pid] = now

    def refresh(self) -> None:
        """Re-read who may not be recorded and write the refusal counts (blocking: run it in
        a thread)."""
        if self.config is None:
            return
        counts, self._refused = self._refused, {}
        add_refusals(self.database, counts)
        codes = not_recording(self.database, self.config)
        self._withdrawn.update(p for p, c in codes.items() if c == WITHDRAWN.code)
        self._blocked = {pid: Standing(False, code) for pid, code in codes.items()}
        # A deleted participant's key must stop working too.
        cached = {v.id for v in self._cache.values()}
        if cached - set(codes):
            from flowtrial.study.participation import existing_ids

            alive = existing_ids(self.database, cached)
            self._cache = {k: v for k, v in self._cache.items() if v.id in alive}

    async def watch(self, interval_s: float = WATCH_S) -> None:
        """Refresh every ``interval_s`` until cancelled (the participation extension)."""
        while True:
            await asyncio.to_thread(self.refresh)
            await asyncio.sleep(interval_s)

    def cached(self, headers: Mapping[str, str], path_key: str | None = None
               ) -> ParticipantInfo | None:
        """The participant if their key is already verified (no I/O)."""
        key = identity_key(headers, path_key)
        return self._cache.get(key) if key else None

    async def authenticate(self, headers: Mapping[str, str], path_key: str | None = None
                           ) -> ParticipantInfo | None:
        """The participant whose flowtrial key this request carries (:func:`identity_key`),
        or None."""
        key = identity_key(headers, path_key)
        if not key:
            return None
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        # The lookup hashes and reads the database: keep it off the event loop.
        p = await asyncio.to_thread(participant_by_key, self.database, key)
        if p is None:
            return None
        info = ParticipantInfo(p.id, bool(p.simulated))
        if self.config is not None:
            self.note(p.id, standing(self.config, p.consent_at, p.withdrawn_at))
        self._cache[key] = info
        return info
