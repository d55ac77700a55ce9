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
from collections.abc import Iterable, Mapping

__all__ = ["HOSTS_ENV", "PASSWORD_ENV", "allowed_hosts", "host_allowed", "is_loopback",
           "password_ok"]

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
