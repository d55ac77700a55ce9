"""The instrumented proxy: shapes latency per arm at token level and records every cycle.

``create_proxy_app`` builds the ASGI app; ``serve_proxy`` runs it in a background thread;
``commands.proxy`` is the ``flowtrial proxy`` CLI command. The names are loaded on first use
so that importing the command (``flowtrial proxy --help``) does not import Starlette.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"create_proxy_app": ".app", "ProxyHandle": ".server", "serve_proxy": ".server"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
