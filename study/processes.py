"""Running a child server (Streamlit, JupyterLab) that must stop when its command stops.

``flowtrial dashboard`` and ``flowtrial notebooks`` each start a server as a child process;
SIGTERM, SIGHUP or Ctrl-C to the command stops the child too, and the command waits for it,
so no server is left behind on its port.
"""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["STOP_GRACE_S", "port_in_use", "run_child"]

#: How long a child server may take to stop after the signal is passed on, before it is killed.
STOP_GRACE_S = 10.0


def _die_with_parent() -> None:  # in the child, before exec
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_child(argv: list[str], env: Mapping[str, str],
              translate: Mapping[int, int] | None = None) -> int:
    """Run ``argv`` and pass SIGINT/SIGTERM/SIGHUP on to it (``translate`` maps a signal to
    the one the child gets instead, e.g. SIGINT → SIGTERM for a server that would ask to
    confirm); returns its exit code. The child also stops if this process dies without a word
    (Linux), and is terminated (then killed) if this function is left any other way."""
    proc = subprocess.Popen(argv, env=dict(env), preexec_fn=_die_with_parent)  # noqa: PLW1509
    mapping = dict(translate or {})

    def forward(signum: int, frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(mapping.get(signum, signum))

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in handled}
    try:
        return proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def port_in_use(host: str, port: int) -> bool:
    """Whether a server could not listen on ``host:port`` (another process holds it). The
    probe binds as servers do (SO_REUSEADDR: a port in TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:  # another kind (no such address) is the server's to report
            return exc.errno == errno.EADDRINUSE
    return False
