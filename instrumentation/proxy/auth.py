"""Participant authentication: their own key is the API key the assistant sends.

The key arrives as ``Authorization: Bearer …`` (OpenAI clients) or ``x-api-key`` (Anthropic
clients). A verified key is cached in memory, so the salted-hash check and the database
lookup happen once per key and process, not on every request. Unknown keys are not cached
(a participant enrolled while the proxy runs is found on their first request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from flowtrial.study.participants import participant_by_key
from flowtrial.study.storage import Database

__all__ = ["Authenticator", "ParticipantInfo", "key_from_headers"]


@dataclass(frozen=True, slots=True)
class ParticipantInfo:
    id: str
    simulated: bool = False


def key_from_headers(headers: Mapping[str, str]) -> str | None:
    """The API key of a request, from ``Authorization: Bearer`` or ``x-api-key``."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


class Authenticator:
    """Finds the participant of a request; verified keys are served from memory."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._cache: dict[str, ParticipantInfo] = {}

    def cached(self, headers: Mapping[str, str]) -> ParticipantInfo | None:
        """The participant if their key is already verified (no I/O)."""
        key = key_from_headers(headers)
        return self._cache.get(key) if key else None

    async def authenticate(self, headers: Mapping[str, str]) -> ParticipantInfo | None:
        """The participant whose key this request carries, or None."""
        key = key_from_headers(headers)
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
