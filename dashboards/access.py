"""Who may see the dashboard: a Host allow-list and, off loopback, a password.

The dashboard shows every participant's data. ``flowtrial dashboard`` serves it on loopback by
default; any other ``--host`` requires a password (``FLOWTRIAL_DASHBOARD_PASSWORD``), which
every browser session must enter before a page renders. Every session's ``Host`` header must
name this machine (loopback names, the ``--host`` address, the machine's names, and what
``--allow-host`` adds): a page reached under another name — DNS rebinding, where a web page
points its own name at 127.0.0.1 — renders nothing.

The checks run in the Streamlit app before any page (``dashboards/app.py``); the settings
reach it through environment variables set by ``flowtrial dashboard``.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping

__all__ = ["HOSTS_ENV", "PASSWORD_ENV", "LoginThrottle", "allowed_hosts", "host_allowed",
           "is_loopback", "login_throttle", "password_ok"]

PASSWORD_ENV = "FLOWTRIAL_DASHBOARD_PASSWORD"
#: Comma-separated host names the Host header may name (set by ``flowtrial dashboard``).
HOSTS_ENV = "FLOWTRIAL_DASHBOARD_HOSTS"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the dashboard on this machine."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> list[str]:
    """The names a Host header may carry for a dashboard listening on ``bind_host``."""
    names = {*LOOPBACK_NAMES, *(e.strip().lower() for e in extra if e.strip())}
    bind = bind_host.strip("[]").lower()
    wildcard = bind in ("0.0.0.0", "::", "")
    if not wildcard:
        names.add(bind)
    if not is_loopback(bind_host):  # reached by this machine's own names
        for name in (socket.gethostname(), socket.getfqdn()):
            names.add(name.lower())
        if wildcard:
            try:
                names.update(str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None))
            except OSError:
                pass
    return sorted(names)


def _host_name(header: str) -> str:
    """The name part of a Host header (``[::1]:8501`` → ``::1``, ``a.b:80`` → ``a.b``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(headers: Mapping[str, str], allowed: Iterable[str]) -> bool:
    """Whether the session's Host header names this machine. No headers at all (Streamlit's
    AppTest, no HTTP involved) passes; a real browser always sends Host."""
    if not headers:
        return True
    host = next((v for k, v in headers.items() if k.lower() == "host"), None)
    if host is None:
        return False
    return _host_name(host) in {a.lower() for a in allowed}


def password_ok(given: str, expected: str) -> bool:
    """Constant-time comparison of the entered password with the configured one."""
    return hmac.compare_digest(given.encode(), expected.encode())


def settings_from_env(env: Mapping[str, str] | None = None) -> tuple[str | None, list[str]]:
    """(the password or None, the Host allow-list) as ``flowtrial dashboard`` passed them."""
    env = os.environ if env is None else env
    hosts = [h for h in env.get(HOSTS_ENV, "").split(",") if h.strip()]
    return env.get(PASSWORD_ENV) or None, hosts or list(LOOPBACK_NAMES)


class LoginThrottle:
    """Wrong passwords per client address, across all its sessions (one server process
    serves them all): at most ``per_minute`` in any minute, then that address waits."""

    def __init__(self, per_minute: int = 5, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def wait_s(self, address: str) -> float:
        """Seconds before ``address`` may try again (0: now)."""
        with self._lock:
            recent = self._recent(address)
            if len(recent) < self.per_minute:
                return 0.0
            return max(0.0, recent[0] + 60.0 - self._clock())

    def failed(self, address: str) -> None:
        with self._lock:
            self._recent(address).append(self._clock())

    def _recent(self, address: str) -> deque[float]:
        now = self._clock()
        recent = self._failures.setdefault(address, deque())
        while recent and recent[0] <= now - 60.0:
            recent.popleft()
        if len(self._failures) > 10_000:  # forget idle addresses (bounded memory)
            for k in [k for k, v in self._failures.items() if not v][:5_000]:
                del self._failures[k]
        return recent


_THROTTLE = LoginThrottle()


def login_throttle() -> LoginThrottle:
    """The dashboard server's throttle (shared by its sessions)."""
    return _THROTTLE
