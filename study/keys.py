"""Participant API keys: shown once, stored only as a salted hash.

A key looks like ``ft_<key_id>_<secret>``. The ``key_id`` is stored in clear so the proxy can
find the participant in one indexed lookup; the secret is verified against a salted SHA-256.
The secret has 192 random bits, so a fast hash is enough (no password stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

PREFIX = "ft_"


@dataclass(frozen=True)
class NewKey:
    key: str
    key_id: str
    salt: str
    key_hash: str


def hash_secret(secret: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def new_key() -> NewKey:
    """A fresh participant key and what to store of it."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    salt = secrets.token_hex(16)
    return NewKey(f"{PREFIX}{key_id}_{secret}", key_id, salt, hash_secret(secret, salt))


def split_key(key: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None."""
    if not key.startswith(PREFIX):
        return None
    rest = key[len(PREFIX):]
    key_id, sep, secret = rest.partition("_")
    if not sep or not key_id or not secret:
        return None
    return key_id, secret


def verify(key: str, salt: str, key_hash: str) -> bool:
    parts = split_key(key)
    if parts is None:
        return False
    return hmac.compare_digest(hash_secret(parts[1], salt), key_hash)


#: The ``meta`` row holding the study's conversation secret (never exported).
CONVERSATION_SECRET = "conversation_secret"


def conversation_secret(engine: Any) -> bytes:
    """The study's secret for keyed conversation hashes (``cycles.conversation_key``): made
    once, kept in the database's ``meta`` table (every proxy process of the study reads the
    same one), left out of exports — so a key is useless to anyone guessing prompts."""
    from sqlalchemy import text

    with engine.begin() as conn:
        row = conn.execute(text("SELECT value FROM meta WHERE key = :k"),
                           {"k": CONVERSATION_SECRET}).first()
        if row is None:
            conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, :v) "
                              "ON CONFLICT (key) DO NOTHING"),
                         {"k": CONVERSATION_SECRET, "v": secrets.token_hex(32)})
            row = conn.execute(text("SELECT value FROM meta WHERE key = :k"),
                               {"k": CONVERSATION_SECRET}).first()
    return bytes.fromhex(row[0])
