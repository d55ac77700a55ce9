"""The database gate: the proxy refuses new work it could not record.

When writing to the study database fails for a reason that is the database's — unreachable,
locked past the busy timeout, disk full, read-only — the gate **trips**: new model requests
get 503 with ``Retry-After`` in their protocol's error shape (a WebSocket ``response.create``
an ``error`` event), the event API 503, and ``/flowtrial/v1/health`` 503. Serving them would
mean traffic the study cannot account for.

Cycles whose rows could not be written — streams that were in flight — are **held** in memory
(at most ``max_held``; beyond that the oldest are dropped and counted). Their clients were
told: the final event was replaced by the protocol's error (see
:mod:`flowtrial.instrumentation.proxy.recorder`), so nothing looked complete that is not recorded.

While tripped, a background task **probes** the database every ``probe_interval_s``: the probe
is a real commit of the oldest held row through the record writer (same thread, connection
and settings as every other commit, so a disk that is still full fails it), or, with nothing
held, taking the write lock and rolling back. The first success re-opens the gate; the other
held rows are then written (group commit), idempotently (a row whose first commit did reach the
database before the error is not written twice).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from flowtrial.study.storage import RecordWriter, WriteBatch

__all__ = ["RETRY_AFTER_S", "UNAVAILABLE_MESSAGE", "DatabaseGate", "DatabaseUnavailable",
           "is_database_failure"]

log = logging.getLogger("flowtrial.proxy")

PROBE_INTERVAL_S = 0.5
RETRY_AFTER_S = 1
MAX_HELD = 10_000
UNAVAILABLE_MESSAGE = (
    "flowtrial cannot record requests right now (the study database is unavailable), so it "
    "refuses them rather than serve them unrecorded: retry shortly")


class DatabaseUnavailable(Exception):
    """The gate is tripped: the record was not attempted (it is held for later)."""


def is_database_failure(exc: BaseException) -> bool:
    """Whether a failed write says the database cannot take writes (trip the gate): an error
    from the database driver, other than one about this row (a constraint, a value). A bug
    building a row, or the writer being shut down, is not the database's failure."""
    from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

    return isinstance(exc, DBAPIError) and not isinstance(exc, IntegrityError | DataError)


def describe(exc: BaseException) -> str:
    """One line naming the failure (``OperationalError: database or disk is full``)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
    return f"{type(orig).__name__}: {text}"[:300]


class DatabaseGate:
    """Open while the database takes writes; see the module docstring."""

    def __init__(self, writer: RecordWriter, *, probe_interval_s: float = PROBE_INTERVAL_S,
                 max_held: int = MAX_HELD) -> None:
        self.writer = writer
        self.probe_interval_s = probe_interval_s
        self.max_held = max_held
        self.ok = True
        self.reason: str | None = None
        self.trips = 0
        self.refused = 0  # requests answered 503 while tripped
        self.recovered = 0  # held rows written after all
        self.dropped = 0  # held rows given up (over max_held, or a row that can never be written)
        self.row_errors = 0  # rows that failed for a reason not the database's (health degraded)
        self._since: float | None = None
        self._held: collections.deque[WriteBatch] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ state
    @property
    def held(self) -> int:
        return len(self._held)

    def trip(self, exc: BaseException) -> None:
        """A write failed because of the database: refuse new work until a probe succeeds."""
        self.reason = describe(exc)
        if self.ok:
            self.ok = False
            self.trips += 1
            self._since = time.monotonic()
            log.error("the study database failed (%s): refusing new requests with 503 until "
                      "it works again", self.reason)
        self._ensure_probe()

    def row_failed(self, exc: BaseException) -> None:
        """A row failed for a reason that is not the database's (a bug building it, a value
        the database refuses): logged and counted; the row is held and retried like any."""
        self.row_errors += 1  # rows the gate held, not answers (those: hooks.count_error)
        log.error("a cycle's row could not be written (%s): held for a retry", describe(exc),
                  exc_info=exc)

    @property
    def degraded(self) -> bool:
        """Serving, but a row has failed for a reason of its own or a held row was lost."""
        return bool(self.row_errors or self.dropped)

    def hold(self, batch: WriteBatch) -> None:
        """Keep a row that could not be written, to write it once the database is back."""
        if len(self._held) >= self.max_held:
            self._held.popleft()
            self.dropped += 1
            log.error("more than %d cycles waiting for the database: the oldest is dropped",
                      self.max_held)
        self._held.append(batch)
        self._ensure_probe()

    def snapshot(self) -> dict[str, Any]:
        """For the health endpoint."""
        return {
            "ok": self.ok,
            "error": self.reason if not self.ok else None,
            "unavailable_s": (round(time.monotonic() - self._since, 3)
                              if not self.ok and self._since is not None else 0.0),
            "held_cycles": len(self._held),
            "recovered_cycles": self.recovered,
            "dropped_cycles": self.dropped,
            "row_errors": self.row_errors,
            "refused_requests": self.refused,
            "trips": self.trips,
        }

    # ------------------------------------------------------------------ probing
    def _ensure_probe(self) -> None:
        if self._closed or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the proxy's loop (a test driving the recorder)
            return
        self._task = loop.create_task(self._probe_loop(), name="flowtrial-db-probe")

    async def _probe_loop(self) -> None:
        while not self.ok or self._held:
            if not self.ok:
                await asyncio.sleep(self.probe_interval_s)
                if not await self._probe():
                    continue
                down = time.monotonic() - (self._since or time.monotonic())
                self.ok, self.reason = True, None
                log.warning("the study database works again after %.1f s: serving requests "
                            "(%d held cycles to write)", down, len(self._held))
            await self._flush()

    async def _probe(self) -> bool:
        """One real attempt: True if the database took it."""
        try:
            if self._held:
                await asyncio.wrap_future(self.writer.submit(self._held[0]))
                self._held.popleft()
                self.recovered += 1
            else:
                await asyncio.to_thread(self._check)
        except Exception as exc:  # noqa: BLE001 - the outcome of the probe
            if is_database_failure(exc):
                self.reason = describe(exc)
            elif self._held:
                self._held.popleft()  # this row can never be written; try the next one
                self.dropped += 1
                log.error("a held cycle cannot be written (%s): dropped", describe(exc))
            return False
        return True

    def _check(self) -> None:
        """With no row to retry: can we take the write lock (SQLite) / reach the server?"""
        engine = self.writer.engine
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                conn.exec_driver_sql("ROLLBACK")
            else:
                conn.exec_driver_sql("SELECT 1")

    async def _flush(self) -> None:
        """Write every held row (one group commit); rows the database refuses again stay."""
        batches = list(self._held)
        self._held.clear()
        futures = [self.writer.submit(b) for b in batches]
        for batch, fut in zip(batches, futures, strict=True):
            try:
                await asyncio.wrap_future(fut)
                self.recovered += 1
            except Exception as exc:  # noqa: BLE001 - sorted below
                if is_database_failure(exc):
                    self._held.append(batch)
                    self.trip(exc)
                else:
                    self.dropped += 1
                    log.error("a held cycle cannot be written (%s): dropped", describe(exc))

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop probing; write what is held if the database takes it (at shutdown)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - cancelled, or its outcome is moot now
                pass
        if self._held:
            try:
                await asyncio.wait_for(self._flush(), timeout_s)
            except TimeoutError:
                pass
        if self._held:
            log.error("%d cycles could not be written: the study database is unavailable",
                      len(self._held))
