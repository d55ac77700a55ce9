"""The instrumented proxy: shapes latency per arm at token level and records every cycle.

``create_proxy_app`` builds the ASGI app; ``serve_proxy`` runs it in a background thread;
``commands.proxy`` is the ``flowtrial proxy`` CLI command.
"""

from instrumentation.proxy.app import create_proxy_app
from instrumentation.proxy.server import ProxyHandle, serve_proxy

__all__ = ["ProxyHandle", "create_proxy_app", "serve_proxy"]
