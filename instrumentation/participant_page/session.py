"""Signed session tokens and CSRF tokens for the participant page (no JavaScript needed).

The participant logs in once with their key (posted in a form, never put in a URL); the
answer sets an HttpOnly, SameSite=Strict cookie holding a token

    base64url({"p": participant, "k": key id, "e": expiry, "n": nonce}) "." base64url(HMAC)

signed with HMAC-SHA256 under a random per-process secret: it is never stored (a secret in
the database would travel with ``flowtrial export``), so restarting the proxy logs
participants out — they paste their key again; their tasks are in the database. The raw key
is not kept anywhere. A token names the key id, checked against the participant's on every
request. Every form carries a CSRF token derived from the
session's nonce (HMAC again): a page of another site cannot produce it, and SameSite=Strict
keeps the cookie off cross-site requests in the first place.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

__all__ = ["Session", "SessionSigner", "new_secret"]

SESSION_TTL_S = 12 * 3600


def new_secret() -> bytes:
    """A fresh signing secret (one per process)."""
    return secrets.token_bytes(32)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


@dataclass(frozen=True)
class Session:
    participant_id: str
    key_id: str
    nonce: str
    expires: int


class SessionSigner:
    """Makes and checks session and CSRF tokens under one secret."""

    def __init__(self, secret: bytes, ttl_s: int = SESSION_TTL_S) -> None:
        if len(secret) < 16:
            raise ValueError("the page secret must have at least 16 bytes")
        self._secret = secret
        self.ttl_s = ttl_s

    def _mac(self, purpose: bytes, msg: bytes) -> bytes:
        return hmac.new(self._secret, purpose + b"\0" + msg, hashlib.sha256).digest()

    def issue(self, participant_id: str, key_id: str, now: float | None = None) -> str:
        """A fresh session token."""
        t = int(time.time() if now is None else now)
        body = json.dumps({"p": participant_id, "k": key_id, "e": t + self.ttl_s,
                           "n": secrets.token_urlsafe(16)}, separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._mac(b'session', body))}"

    def verify(self, token: str | None, now: float | None = None) -> Session | None:
        """The session of a valid, unexpired token, else None."""
        if not token or token.count(".") != 1 or len(token) > 1024:
            return None
        b, _, sig = token.partition(".")
        try:
            body, mac = _unb64(b), _unb64(sig)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac(b"session", body)):
            return None
        try:
            d = json.loads(body)
            sess = Session(str(d["p"]), str(d["k"]), str(d["n"]), int(d["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if sess.expires <= (time.time() if now is None else now):
            return None
        return sess

    def csrf(self, session: Session) -> str:
        """The CSRF token for forms of this session."""
        return _b64(self._mac(b"csrf", session.nonce.encode()))[:32]

    def check_csrf(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(session), str(token))
