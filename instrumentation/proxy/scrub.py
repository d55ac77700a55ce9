"""Keeping keys out of error text: what an upstream says when it fails may quote a secret.

An upstream that refuses a key often quotes it ("Incorrect API key provided: sk-…"), and an
error may echo the request, which can carry the participant's own key. Before upstream-derived
error text is stored in ``cycles.error`` or relayed to the client in an error answer or event,
every occurrence of the study's upstream key values (read from the variables the study names,
at that moment: they are never stored) and of the requesting participant's key is replaced by
:data:`REDACTED`. Only error paths build a :class:`Scrubber`; the token path never does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from study.config import StudyConfig

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Scrubber", "upstream_key_values"]

REDACTED = "[redacted]"
#: Shorter values are no secret worth protecting, and replacing them (a test's key "x")
#: would mangle every message they occur in.
MIN_SECRET_CHARS = 6


def upstream_key_values(config: StudyConfig) -> list[str]:
    """The current values of every upstream key variable the study names (any side)."""
    up = config.upstream
    names = [up.api_key_env] + [e.api_key_env for e in (up.openai, up.anthropic) if e]
    return [v for n in names if n and (v := os.environ.get(n))]


class Scrubber:
    """Replaces the given secrets in text (:meth:`text`) or bytes (:meth:`raw`) with
    :data:`REDACTED`."""

    __slots__ = ("_texts", "_bytes")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        found: set[str] = set()
        for s in secrets:
            if not s or len(s) < MIN_SECRET_CHARS:
                continue
            found.add(s)
            # Inside a JSON string a key may appear escaped ("\/" for "/", \uXXXX for others).
            for escaped in (json.dumps(s)[1:-1], json.dumps(s, ensure_ascii=False)[1:-1]):
                found.add(escaped)
                found.add(escaped.replace("/", "\\/"))
        # Longest first: a secret that contains another is replaced whole.
        self._texts = sorted(found, key=len, reverse=True)
        self._bytes = [(s.encode(), REDACTED.encode()) for s in self._texts]

    @classmethod
    def for_request(cls, config: StudyConfig, client_key: str | None) -> Scrubber:
        """All the study's upstream keys plus the requesting participant's key."""
        return cls([*upstream_key_values(config), client_key])

    def text(self, s: str) -> str:
        for secret in self._texts:
            if secret in s:
                s = s.replace(secret, REDACTED)
        return s

    def raw(self, b: bytes) -> bytes:
        for secret, marker in self._bytes:
            if secret in b:
                b = b.replace(secret, marker)
        return b
