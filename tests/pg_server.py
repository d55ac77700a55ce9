"""A real PostgreSQL server for the tests, started from Debian's `postgresql` binaries in a
temporary directory on a free loopback port (`.ci/run` installs the package).

PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to the
`postgres` system user the Debian package creates, and its commands run through `runuser`.
Each test gets its own database (``PgServer.new_database``), so tests never see each
other's rows. fsync is off: these tests are about our storage paths, not PostgreSQL's own
crash safety.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

USER = "flowtrial"


def find_bindir() -> Path | None:
    """The directory holding initdb/pg_ctl (newest Debian cluster version first)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """A running throwaway cluster."""

    bindir: Path
    root: Path
    port: int
    as_postgres: bool

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", "postgres", "--"] if self.as_postgres else []) + list(args)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._cmd(*args), capture_output=True, text=True,
                              timeout=timeout, check=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """Create an empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.root} -c fsync=off "
                "-c full_page_writes=off -c max_connections=400 -c shared_buffers=32MB")
        self.run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                 str(self.root / "server.log"), "-o", opts, "-w", "-t", "60", "start",
                 timeout=90)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash as far as clients can tell)."""
        subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m",
                                 mode, "-w", "stop"), capture_output=True, timeout=60)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_server() -> PgServer:
    """initdb + start a cluster; raises RuntimeError with the reason if it cannot."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries (initdb) not found: "
                           "install Debian's `postgresql` package (`.ci/run` does)")
    as_postgres = os.geteuid() == 0
    # Not under pytest's tmp dir: that is private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="flowtrial-pg-"))
    if as_postgres:
        shutil.chown(root, "postgres", "postgres")
    server = PgServer(bindir, root, free_port(), as_postgres)
    try:
        server.run(str(bindir / "initdb"), "-D", str(server.data), "-U", USER,
                   "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C.UTF-8")
        server.start()
    except subprocess.CalledProcessError as exc:
        log = server.root / "server.log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {exc.stderr or exc}\n{tail}") from exc
    return server
