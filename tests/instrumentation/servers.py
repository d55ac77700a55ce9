"""Test helper: run any ASGI app under a real uvicorn server on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

__all__ = ["run_asgi_server"]


@contextmanager
def run_asgi_server(
    app: Any, *, host: str = "127.0.0.1", startup_timeout: float = 10.0, **config: Any
) -> Iterator[str]:
    """Serve `app` in a background thread; yields its base URL, e.g. `http://127.0.0.1:54321`.

    The socket is bound before uvicorn starts (no port race). Extra keyword arguments go to
    `uvicorn.Config`. On exit the server is asked to stop and its thread joined.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    settings: dict[str, Any] = {"log_level": "warning", "timeout_graceful_shutdown": 2}
    server = uvicorn.Server(uvicorn.Config(app, **(settings | config)))
    # uvicorn only installs signal handlers on the main thread, so a worker thread is fine.
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited during startup (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start within {startup_timeout} s")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
