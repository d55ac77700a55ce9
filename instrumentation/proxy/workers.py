"""``flowtrial proxy --workers N``: several proxy processes serving one listening socket.

One Python process paces every token of every stream on one event loop; at a few hundred
concurrent streams that loop is saturated and timing precision goes (the soak benchmark shows
it). With ``--workers N`` the command binds the socket and prepares the database once, then
forks N worker processes that each run the whole proxy (its own event loop, record writer and
upstream connections) on that socket: the kernel hands each new connection to one of them.

- Every worker records into the same database (``cycles.recorded_by`` names it, host:pid);
  group commit and the database gate work per worker.
- Per-prompt draws: each worker claims its own blocks of request indices from the database,
  so two workers serving one participant never repeat a draw
  (:class:`~flowtrial.instrumentation.proxy.arms.ArmResolver`).
- Participant-page sessions are signed with one secret made here and shared by the workers,
  so a login holds whichever worker serves the next request.
- The supervisor (this process) restarts a worker that dies (a crash, kill -9) and, on
  SIGINT or SIGTERM, sends SIGTERM once to every worker and waits for their graceful drain.
  Workers run in their own process group, so a terminal's Ctrl-C reaches them only through
  the supervisor (twice would make uvicorn cut open streams short).

Health and admin counters are per worker (whichever one answers).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from flowtrial.study.config import StudyConfig

from . import shared_counts

if TYPE_CHECKING:
    from .extensions import ProxyExtension

__all__ = ["MAX_WORKERS", "run_workers"]

MAX_WORKERS = 64
#: A worker that exits with an error sooner than this after its start is not restarted (a
#: start-up failure would only repeat); one killed by a signal is, after a short pause.
MIN_UPTIME_S = 2.0


def _worker_main(db: str, config: StudyConfig, sock: socket.socket, k: int,
                 instance: str | None, page_secret: bytes, grace_s: float,
                 extensions: Sequence[ProxyExtension] | None) -> int:
    """Run one worker until it is told to stop (in the forked child)."""
    from flowtrial.study.storage import open_db

    from .app import create_proxy_app
    from .server import make_server
    from .state import close_writer, make_writer

    os.setpgid(0, 0)  # out of the terminal's process group: signals come via the supervisor
    shared_counts.attach(k)  # its part of the caps counted across workers
    # Fresh database handles: connections must never be shared across a fork.
    database = open_db(db)
    writer = make_writer(database)
    name = f"{instance}/{k}" if instance else None
    app = create_proxy_app(database, config, writer=writer, instance=name,
                           page_secret=page_secret, extensions=extensions)
    server = make_server(app, grace_s, config.proxy)
    try:
        server.run(sockets=[sock])
    finally:
        close_writer(writer)
        database.dispose()
    return 0


def _fork(target: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:  # the child never returns into the supervisor's code
        code = 1
        try:
            code = target()
        except BaseException:  # noqa: BLE001 - report and exit without running parent code
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def run_workers(db: str, config: StudyConfig, sock: socket.socket, n: int, *,
                instance: str | None, grace_s: float,
                log: Callable[[str], None],
                extensions: Sequence[ProxyExtension] | None = None) -> int:
    """Fork ``n`` workers serving ``sock`` and supervise them until SIGINT/SIGTERM.

    Call with no threads running and no database connection open (they would be forked).
    Returns the exit code: 0 after a clean stop.
    """
    page_secret = os.urandom(32)
    shared_counts.share_across(n)  # mapped before the forks: every worker sees one table
    children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, start time)
    stopping = False

    def start(k: int) -> None:
        pid = _fork(lambda: _worker_main(db, config, sock, k, instance, page_secret,
                                         grace_s, extensions))
        children[pid] = (k, time.monotonic())

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return  # once: a second SIGTERM would make a worker cut open streams short
        stopping = True
        log(f"stopping {len(children)} worker(s): open streams finish first")
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        for k in range(n):
            start(k)
        log(f"{n} worker processes: " + ", ".join(str(p) for p in children))
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid not in children:
                continue
            k, started = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if stopping:
                failed = failed or code != 0
                continue
            how = f"exit code {code}" if code >= 0 else f"signal {-code}"
            young = time.monotonic() - started < MIN_UPTIME_S
            if young and code > 0:  # it failed by itself at start: it would again
                log(f"worker {k} (pid {pid}) failed at start ({how}): stopping")
                failed = True
                stop(signal.SIGTERM, None)
                continue
            log(f"worker {k} (pid {pid}) ended ({how}): starting a new one")
            if young:
                time.sleep(0.5)  # killed again and again: do not spin
            start(k)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 1 if failed else 0
