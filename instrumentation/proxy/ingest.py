"""The ingest path: uploads are parsed, validated and mapped away from the event loop that
releases tokens, through bounded admission, and stored behind the token path's records.

Why processes: parsing JSON or protobuf, validating with pydantic and mapping records are
C or Python code that holds the GIL for their whole run: in a thread of the proxy's process a
9.8 MB JSON body still stops the event loop for the length of ``json.loads``
(``benchmarks/bench_ingest_isolation.py`` measures both). An ingest process (nice 10, so the
kernel favours the proxy on a shared machine) takes the body's bytes and gives back at most
``max_records_per_post`` capped rows; the proxy's loop only reads the body and passes it on.

API (for any upload endpoint; the event API, Continue and OTLP use it, and so may a new one):

- ``ingest = ingest_of(state)``: the proxy's :class:`Ingest` (made on first use, closed by
  the app's lifespan). Outside a proxy, ``Ingest(database_url, writer=None, settings,
  processes=False)`` runs the same jobs in a thread and writes directly.
- ``result = await ingest.run(pid, job, *args)``: runs ``job(*args)`` (a module-level
  function of picklable arguments, e.g. in :mod:`.ingest_jobs`; pass ``ingest.context``
  for the database and the caps) in an ingest process. Admission first: at most
  ``proxy.ingest_queue`` uploads wait or run at once (beyond: :class:`IngestBusy` 503), at
  most ``proxy.ingest_per_participant`` of one participant (429), and none while the
  writer's bulk queue holds more than :data:`MAX_BULK_ROWS_FACTOR` posts' worth of rows
  (503). The job's own exceptions come back as raised (they must be picklable).
- ``await ingest.store(pid, batch)``: counts the rows against the participant's
  ``proxy.max_stored_bytes_per_day`` (429 with ``Retry-After`` = the seconds to the next UTC
  day; nothing written) and writes them as bulk (after every cycle row:
  :class:`~flowtrial.study.storage.RecordWriter`); returns once durable.
- :class:`IngestBusy` carries ``status`` (429 or 503), ``code``, ``message`` and
  ``retry_after`` (seconds): answer it in the endpoint's protocol shape with a
  ``Retry-After`` header (:meth:`IngestBusy.headers`).

The processes start at the first upload, off the event loop (a thread waits for the fork
server); meanwhile an upload of at most :data:`WARMING_THREAD_BYTES` is handled in a thread
(a first small post is not kept waiting for seconds), a larger one waits for them.

The participant's share and the daily quota hold across ``--workers`` (their counts are in
:mod:`.shared_counts`, ``ingest`` and ``quota``; both add, then check, so never over).
The quota's count is what the workers stored today plus, seeded from the database the first
time a worker stores for a participant on a day, what was stored before (an earlier run, a
worker that died): the database's figure less what the live workers had counted then.
``proxy.ingest_queue`` bounds each worker's own ingest processes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from flowtrial.study.config import ProxySection
from flowtrial.study.storage import Database, RecordWriter, WriteBatch, write_rows

from ..upload_caps import UploadCaps
from . import shared_counts
from .ingest_jobs import JobContext, row_bytes, stored_since, worker_init
from .refusal import Refusal

__all__ = ["MAX_BULK_ROWS_FACTOR", "Ingest", "IngestBusy", "ingest_of"]

log = logging.getLogger("flowtrial.proxy")
T = TypeVar("T")
#: Admission stops while the writer holds more than this many posts' worth of bulk rows.
MAX_BULK_ROWS_FACTOR = 10
BUSY_RETRY_S = 1
#: While the ingest processes start (once, at the first upload), an upload at most this big
#: is handled in a thread meanwhile; a larger one waits for them.
WARMING_THREAD_BYTES = 64 * 1024
_PRELOAD = ["flowtrial.instrumentation.proxy.ingest_jobs",
            "flowtrial.instrumentation.proxy.events_api",
            "flowtrial.instrumentation.telemetry.ingest",
            "flowtrial.instrumentation.continue_data",
            "flowtrial.instrumentation.proxy.body_parser"]
_ctx_lock = threading.Lock()
_mp_context: Any = None


class IngestBusy(Refusal):
    """Ingest refuses an upload for now: 503 (saturated) or 429 (this participant's share or
    daily quota); the uploader should retry after ``retry_after`` seconds."""

    def __init__(self, status: int, code: str, message: str, retry_after: int) -> None:
        super().__init__(status, message, code)
        self.retry_after = retry_after
        self.type_ = "rate_limit_error" if status == 429 else "server_error"

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)}


def _context() -> Any:
    """The forkserver context: children fork from a clean server process that has the job
    modules loaded (never from the proxy's threads)."""
    global _mp_context
    with _ctx_lock:
        if _mp_context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
            _mp_context = ctx
        return _mp_context


def _noop() -> None:
    return None


def _seeded(fn: Callable[..., T], args: tuple[Any, ...], ctx: JobContext | None, pid: str,
            since: datetime | None) -> tuple[T, int | None]:
    """Run ``fn`` and, if asked, read what ``pid`` stored since ``since`` (in the process)."""
    result = fn(*args)
    seed = stored_since(ctx, pid, since) if ctx is not None and since is not None else None
    return result, seed


class Ingest:
    """Bounded, off-loop ingest of uploads (module docstring)."""

    def __init__(self, database_url: str, writer: RecordWriter | None, settings: ProxySection,
                 *, processes: bool = True) -> None:
        self.context = JobContext(database_url, UploadCaps.from_config(settings))
        self.writer = writer
        self.settings = settings
        self.processes = processes
        self._pool: Executor | None = None
        self._lock = threading.Lock()
        self._warm = threading.Event()  # the processes are up
        self._warmer: threading.Thread | None = None
        self._running = 0
        self._per_participant = shared_counts.counts("ingest")  # pid -> uploads, all workers
        self._quota = shared_counts.counts("quota")  # "pid/day" -> bytes, all workers
        self._day = ""  # the UTC day this worker's part of _quota counts
        self._before: dict[str, int] = {}  # "pid/day" -> stored before the live workers' count
        self.refused = {"busy": 0, "participant": 0, "quota": 0}
        self.jobs = 0

    # -- admission ---------------------------------------------------------------------
    def _admit(self, pid: str) -> None:
        """Refuse (503/429) or take one of ``pid``'s share (give it back in ``run``)."""
        s = self.settings
        bulk = self.writer.bulk_pending_rows if self.writer is not None else 0
        if self._running >= s.ingest_queue or bulk > MAX_BULK_ROWS_FACTOR * max(
                s.max_records_per_post, 1000):
            self.refused["busy"] += 1
            raise IngestBusy(503, "ingest_busy", "the proxy is busy storing uploads "
                             f"(proxy.ingest_queue = {s.ingest_queue}): retry after "
                             f"{BUSY_RETRY_S} s", BUSY_RETRY_S)
        self._per_participant.add(pid, 1)
        if self._per_participant.total(pid) > s.ingest_per_participant:
            self._per_participant.add(pid, -1)
            self.refused["participant"] += 1
            raise IngestBusy(429, "too_many_uploads", "too many uploads of this participant "
                             f"at once (proxy.ingest_per_participant = "
                             f"{s.ingest_per_participant}): retry after {BUSY_RETRY_S} s",
                             BUSY_RETRY_S)

    def _executor(self) -> Executor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.settings.ingest_workers,
                                                 mp_context=_context(),
                                                 initializer=worker_init)
            return self._pool

    def _small_while_warming(self, args: tuple[Any, ...]) -> bool:
        """Whether to run this job in a thread: the processes are still starting (seconds on
        a busy machine, once) and its body is small enough to parse anywhere."""
        if self._warm.is_set():
            return False
        with self._lock:
            if self._warmer is None:
                self._warmer = threading.Thread(target=self._warm_up, name="flowtrial-ingest-"
                                                "warm-up", daemon=True)
                self._warmer.start()
        size = sum(len(a) for a in args if isinstance(a, bytes | bytearray))
        return size <= WARMING_THREAD_BYTES

    def _warm_up(self) -> None:
        try:
            self._submit(_noop).result(timeout=120)
        except Exception:  # noqa: BLE001 - the next job reports a broken pool
            log.warning("the ingest processes did not start", exc_info=True)
        finally:
            self._warm.set()

    def _submit(self, *args: Any) -> Future[Any]:
        # In a thread: the first submit starts the processes, and starting one waits for
        # the fork server (its module imports: seconds on a busy machine).
        return self._executor().submit(*args)

    async def run(self, pid: str, job: Callable[..., T], *args: Any) -> T:
        """``job(*args)`` in an ingest process, once admitted (module docstring)."""
        self._admit(pid)
        self._running += 1
        self.jobs += 1
        day, since = _today()
        seed_since = since if f"{pid}/{day}" not in self._before else None
        try:
            if not self.processes or self._small_while_warming(args):
                result, seed = await asyncio.to_thread(_seeded, job, args, self.context, pid,
                                                       seed_since)
            else:
                try:
                    fut = await asyncio.to_thread(self._submit, _seeded, job, args,
                                                  self.context, pid, seed_since)
                    result, seed = await asyncio.wrap_future(fut)
                except BrokenProcessPool:
                    log.warning("an ingest process died: starting new ones")
                    self._discard_pool()
                    raise IngestBusy(503, "ingest_restarting", "the proxy's ingest process "
                                     "restarted: retry", BUSY_RETRY_S) from None
            if seed is not None:
                self._seed(f"{pid}/{day}", day, seed)
            return result
        finally:
            self._running -= 1
            self._per_participant.add(pid, -1)

    def _seed(self, key: str, day: str, stored: int) -> None:
        """What the database says ``key`` stored today, less what the workers count."""
        self._new_day(day)
        self._before.setdefault(key, max(0, stored - self._quota.total(key)))

    def _new_day(self, day: str) -> None:
        """At a new UTC day this worker's counts of the last one go (keys name their day)."""
        if day != self._day:
            self._day = day
            self._quota.clear_mine()
            self._before = {k: v for k, v in self._before.items() if k.endswith("/" + day)}

    # -- storing -----------------------------------------------------------------------
    async def store(self, pid: str, batch: WriteBatch, database: Database | None = None
                    ) -> None:
        """Count ``batch`` against the daily quota, then write it as bulk (durable on return).
        Without a writer (outside a proxy) it writes to ``database`` in a thread."""
        day, since = _today()
        size = row_bytes(list(batch.rows))
        key = f"{pid}/{day}"
        self._new_day(day)
        cap = self.settings.max_stored_bytes_per_day
        shared = self._quota.add(key, size)
        if not shared:  # this worker's part of the table is full: count it here
            log.warning("the quota table of this worker is full: %s counted in it only", pid)
            self._before[key] = self._before.get(key, 0) + size
        if self._quota.total(key) + self._before.get(key, 0) > cap:
            self._unreserve(key, size, shared)
            self.refused["quota"] += 1
            wait = int((since + timedelta(days=1) - datetime.now(UTC)).total_seconds()) + 1
            raise IngestBusy(429, "daily_quota", f"this participant's uploads today reached "
                             f"the proxy's limit of {cap} bytes "
                             "(proxy.max_stored_bytes_per_day): nothing of this upload was "
                             "stored; retry tomorrow (UTC)", wait)
        try:
            if self.writer is not None:
                await asyncio.wrap_future(self.writer.submit(batch, bulk=True))
            elif database is not None:
                await asyncio.to_thread(write_rows, database, [batch])
            else:
                raise RuntimeError("Ingest.store needs a writer or a database")
        except BaseException:
            self._unreserve(key, size, shared)
            raise

    def _unreserve(self, key: str, size: int, shared: bool) -> None:
        if shared:
            self._quota.add(key, -size)
        else:
            self._before[key] = max(0, self._before.get(key, 0) - size)

    # -- lifecycle ---------------------------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        return {"jobs": self.jobs, "running": self._running,
                "bulk_rows_pending": self.writer.bulk_pending_rows if self.writer else 0,
                **{f"refused_{k}": v for k, v in self.refused.items()}}

    def _discard_pool(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the ingest processes (waits for running jobs)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _today() -> tuple[str, datetime]:
    now = datetime.now(UTC)
    start = datetime(now.year, now.month, now.day, tzinfo=UTC)
    return start.date().isoformat(), start


def ingest_of(state: Any) -> Ingest:
    """The proxy's :class:`Ingest` (made on first use; the app's lifespan closes it)."""
    ingest: Ingest | None = getattr(state, "ingest", None)
    if ingest is None:
        ingest = Ingest(state.database.url, state.writer, state.config.proxy)
        state.ingest = ingest
    return ingest
