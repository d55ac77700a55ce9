"""Running the proxy: in a background thread (``serve_proxy``) or in the foreground (CLI).

``serve_proxy`` is what the simulator, ``flowtrial demo`` and the tests use::

    with serve_proxy("study.db", config) as proxy:
        client = OpenAI(base_url=proxy.base_url + "/v1", api_key=participant_key)

On exit it stops accepting connections, lets open streams finish for up to ``grace_s``
(then records them as abandoned), drains the record writer and closes the database.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from flowtrial.study.config import ProxySection, StudyConfig
from flowtrial.study.errors import FlowtrialError
from flowtrial.study.storage import Database, RecordWriter, init_db

from .app import create_proxy_app
from .extensions import ProxyExtension
from .front_door import WS_FRAME_SLACK, FrontDoorStats, Limits, guarded_protocol
from .state import ProxyState, close_writer, make_writer
from .upstream import Upstream, UpstreamRouter

__all__ = ["ProxyHandle", "ProxyStartError", "bind_socket", "make_server", "serve_proxy"]


class ProxyStartError(FlowtrialError):
    """The proxy could not start (port taken, bad host, ...)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ProxyStartError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --port "
            "or stop the program using it"
        ) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def base_url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class _ProxyServer(uvicorn.Server):
    """uvicorn, minus re-raising SIGTERM/SIGINT after its graceful shutdown: the caller still
    has the writer to drain and a summary to print once ``run`` returns."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for open streams
        else:
            self.should_exit = True


def make_server(app: Any, grace_s: float, settings: ProxySection | None = None,
                log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for the proxy app (no access log: it costs time on every request),
    behind the front door's limits from ``settings`` (the study's ``[proxy]``)."""
    settings = settings or ProxySection()
    limits = Limits.from_config(settings)
    stats = FrontDoorStats()
    app.state.front_door = stats  # the health endpoint shows what was refused
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="on",
        http=guarded_protocol(limits, stats),
        timeout_graceful_shutdown=max(1, round(grace_s)),
        timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
        # WebSocket turns are one small frame per token: compressing each costs the loop
        # ~7 µs a frame (15 % of its time at 100 streams) to save bytes on loopback/LAN.
        ws_per_message_deflate=False,
        ws_max_size=settings.max_body_bytes + WS_FRAME_SLACK,  # larger: close 1009
    )
    return _ProxyServer(config)


@dataclass
class ProxyHandle:
    """A running proxy: where it listens and what it has done."""

    base_url: str
    database: Database
    writer: RecordWriter
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self) -> ProxyState:
        return self.app.state.proxy

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])


@contextlib.contextmanager
def serve_proxy(db: str | Path, config: StudyConfig, host: str = "127.0.0.1", port: int = 0,
                *, upstream: Upstream | UpstreamRouter | None = None,
                grace_s: float = 10.0,
                extensions: Sequence[ProxyExtension] | None = None) -> Iterator[ProxyHandle]:
    """Run the proxy for ``config`` on ``db`` in a background thread (see module doc);
    ``extensions`` as for :func:`~.app.create_proxy_app`."""
    database = init_db(db, config)
    writer = make_writer(database)
    app = create_proxy_app(database, config, writer=writer, upstream=upstream, grace_s=grace_s,
                           extensions=extensions)
    try:
        sock = bind_socket(host, port)
    except BaseException:
        close_writer(writer)
        database.dispose()
        raise
    server = make_server(app, grace_s, config.proxy)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="flowtrial-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            close_writer(writer)
            database.dispose()
            sock.close()
            raise ProxyStartError("the proxy failed to start: see the log above")
        time.sleep(0.005)
    handle = ProxyHandle(base_url_of(sock), database, writer, app, server, thread)
    try:
        yield handle
    finally:
        server.should_exit = True
        thread.join(grace_s + 15)
        close_writer(writer)
        sock.close()
        database.dispose()
