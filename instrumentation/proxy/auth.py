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
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from flowtrial.study.participants import participant_by_key
from flowtrial.study.storage import Database

__all__ = [
    "CREDENTIAL_HEADERS",
    "FLOWTRIAL_KEY_HEADER",
    "PATH_KEY",
    "Authenticator",
    "ParticipantInfo",
    "client_secrets",
    "identity_key",
    "key_from_headers",
    "separate_identity",
]


@dataclass(frozen=True, slots=True)
class ParticipantInfo:
    id: str
    simulated: bool = False


#: Headers that carry a provider credential (a participant's key, or their own under
#: pass-through); never forwarded as they are to a study-key upstream, never recorded.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")
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
    for name in ("x-api-key", "x-goog-api-key"):
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

    def __init__(self, database: Database) -> None:
        self.database = database
        self._cache: dict[str, ParticipantInfo] = {}

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
        self._cache[key] = info
        return info
