r"""Keeping keys out of error text: what an upstream says when it fails may quote a secret.

An upstream that refuses a key often quotes it ("Incorrect API key provided: sk-…"), and an
error may echo the request, which can carry the participant's own key. Before upstream-derived
error text is stored in ``cycles.error`` or relayed to the client in an error answer or event,
every occurrence of the study's upstream key values (read from the variables the study names,
at that moment: they are never stored) and of the requesting participant's key is replaced by
:data:`REDACTED` — also where a JSON string spells it with escapes (``\u0073k-…``, ``\/``):
every JSON string literal holding a backslash is decoded and checked. The upstream's response
headers pass back to the client, so their values are scrubbed too (:meth:`Scrubber.headers`).
Only error paths and response headers use a :class:`Scrubber`; the token path never does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from flowtrial.study.config import StudyConfig

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Scrubber", "upstream_key_values"]

REDACTED = "[redacted]"
#: Shorter values are no secret worth protecting, and replacing them (a test's key "x")
#: would mangle every message they occur in.
MIN_SECRET_CHARS = 6
# A JSON string literal that holds at least one escape (the only place a key can hide from a
# plain search); decoded, checked, and written back re-encoded if it held a key.
_ESCAPED_STRING = re.compile(r'"(?:[^"\\]*\\.)+[^"\\]*"')
_ESCAPED_BYTES = re.compile(_ESCAPED_STRING.pattern.encode())


def upstream_key_values(config: StudyConfig) -> list[str]:
    """The current values of every upstream key variable the study names (any side)."""
    up = config.upstream
    names = [up.api_key_env] + [e.api_key_env for e in up.endpoints().values()] + [
        u.api_key_env for u in config.upstreams.values()]
    return [v for n in names if n and (v := os.environ.get(n))]


class Scrubber:
    """Replaces the given secrets in text (:meth:`text`) or bytes (:meth:`raw`) with
    :data:`REDACTED`."""

    __slots__ = ("_texts", "_bytes", "_plain")

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
        self._plain = [s for s in self._texts if "\\" not in s]

    @classmethod
    def for_request(cls, config: StudyConfig, client_key: str | list[str] | None) -> Scrubber:
        """All the study's upstream keys plus the requesting participant's key(s) (their
        flowtrial key and, under pass-through, their own provider credential)."""
        keys = client_key if isinstance(client_key, list) else [client_key]
        return cls([*upstream_key_values(config), *keys])

    def text(self, s: str) -> str:
        for secret in self._texts:
            if secret in s:
                s = s.replace(secret, REDACTED)
        if self._texts and "\\" in s:
            s = _ESCAPED_STRING.sub(self._literal, s)
        return s

    def raw(self, b: bytes) -> bytes:
        for secret, marker in self._bytes:
            if secret in b:
                b = b.replace(secret, marker)
        if self._bytes and b"\\" in b:
            b = _ESCAPED_BYTES.sub(self._literal_bytes, b)
        return b

    def headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Header pairs with every secret in their values replaced."""
        return [(k, self.text(v)) for k, v in headers] if self._texts else headers

    def _literal(self, m: re.Match[str]) -> str:
        found = self._redacted_literal(m.group(0))
        return m.group(0) if found is None else found

    def _literal_bytes(self, m: re.Match[bytes]) -> bytes:
        found = self._redacted_literal(m.group(0).decode("utf-8", "replace"))
        return m.group(0) if found is None else found.encode()

    def _redacted_literal(self, literal: str) -> str | None:
        """A JSON string literal re-encoded with its secrets replaced, or None if its decoded
        value holds none (the literal then stays as it was, byte for byte)."""
        try:
            value = json.loads(literal)
        except ValueError:
            return None
        if not isinstance(value, str) or not any(s in value for s in self._plain):
            return None
        for secret in self._plain:
            value = value.replace(secret, REDACTED)
        return json.dumps(value, ensure_ascii=False)
