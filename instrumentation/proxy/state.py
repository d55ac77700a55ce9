"""Process-wide proxy state: the pieces every request uses, counters, and open cycles."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time

from flowtrial.study.config import StudyConfig
from flowtrial.study.keys import conversation_secret
from flowtrial.study.storage import Database, RecordWriter, create_db_engine

from ..turns.tracker import TurnTracker, turn_rules
from . import shared_counts
from .arms import ArmResolver
from .auth import Authenticator
from .body_parser import BodyParser
from .ingest import Ingest
from .quiet_gc import QuietCollector
from .recorder import Recorder
from .routing import UpstreamRouter
from .runtime_tuning import writer_thread_started

__all__ = ["ProxyState", "close_writer", "make_writer", "new_cycle_id"]


def make_writer(database: Database) -> RecordWriter:
    """The proxy's record writer, on its own pooled engine: the writer thread keeps one
    connection open instead of reopening the database for every commit. It runs nicer than
    the event loop (:mod:`.runtime_tuning`)."""
    return RecordWriter(create_db_engine(database.url, pooled=True),
                        name="flowtrial-proxy-writer", on_start=writer_thread_started)


def close_writer(writer: RecordWriter) -> None:
    """Drain and stop a writer from :func:`make_writer`, then release its connections."""
    writer.close()
    writer.engine.dispose()


def new_cycle_id() -> str:
    """``cyc_`` + creation time in ms (hex, so ids sort by time) + 64 random bits."""
    return f"cyc_{time.time_ns() // 1_000_000:011x}{secrets.token_hex(8)}"


class ProxyState:
    """Everything the routes share; one per app."""

    def __init__(self, database: Database, config: StudyConfig, writer: RecordWriter,
                 upstreams: UpstreamRouter, instance: str | None = None) -> None:
        self.database = database
        self.instance = instance or f"{socket.gethostname()}:{os.getpid()}"
        self.config = config
        self.writer = writer
        self.upstreams = upstreams
        self.auth = Authenticator(database, config)
        self.arms = ArmResolver(database, config)
        self.recorder = Recorder(writer, config.capture.content, recorded_by=self.instance)
        self.keepalive_ns = int(config.proxy.keepalive_s * 1e9)
        self.max_body_bytes = config.proxy.max_body_bytes
        self.ws_inbox_bytes = config.proxy.ws_inbox_bytes
        # One anchor pair per process joins the monotonic timeline to UTC
        # (docs/concepts/timeline.md).
        self.mono_anchor_ns = time.monotonic_ns()
        self.wall_anchor_ns = time.time_ns()
        self.started_monotonic = time.monotonic()
        #: Classifies requests and keeps the turns table (docs/concepts/turns.md).
        self.turns = TurnTracker(self.mono_anchor_ns, self.wall_anchor_ns, database=database,
                                 rules=turn_rules(config),
                                 secret=conversation_secret(database.engine))
        self.requests = 0
        self.errors = 0
        self.open_cycles: dict[str, str] = {}  # cycle id -> participant id (in flight)
        # participant id -> open WebSockets, summed over --workers (.shared_counts)
        self.websockets = shared_counts.counts()
        self._idle: asyncio.Event | None = None
        self.collector: QuietCollector | None = None  # set by the app's lifespan
        self.parser = BodyParser()  # large model request bodies, parsed off the loop
        self.ingest: Ingest | None = None  # uploads' off-loop path, made on first use (.ingest)

    # -- open cycles (event API ownership checks, graceful shutdown) ----------------------
    def open_cycle(self, cycle_id: str, participant_id: str) -> None:
        self.open_cycles[cycle_id] = participant_id

    def close_cycle(self, cycle_id: str) -> None:
        self.open_cycles.pop(cycle_id, None)
        if not self.open_cycles and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no cycle is in flight (True) or ``timeout`` passes (False)."""
        if not self.open_cycles:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def snapshot(self) -> dict[str, int | float]:
        """Counters for the health endpoint and the CLI's live display."""
        return {
            "requests": self.requests,
            "open_streams": len(self.open_cycles),
            "cycles_recorded": self.recorder.recorded,
            "record_failures": self.recorder.failed,
            "errors": self.errors,
            "writer_queue": self.writer.pending,
            "uptime_s": round(time.monotonic() - self.started_monotonic, 3),
        }
