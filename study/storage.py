"""Opening a study database, and the single writer thread that makes records durable.

SQLite is used the way datasette/sqlite-utils use it: WAL mode, so readers (dashboard,
analysis) never block the writer, and one writer thread fed by a queue, so concurrent
streams share a commit (group commit) instead of fighting over the write lock.
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Insert, create_engine, event, inspect, make_url, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import NullPool
from sqlmodel import Session, SQLModel

from .config import StudyConfig, parse_study
from .errors import FlowtrialError
from .migrate import stamp_head, upgrade
from .schema import SCHEMA_VERSION, TABLES, Arm, Meta, Study


class StorageError(FlowtrialError):
    """The database cannot be used as asked (wrong version, wrong study, missing)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def database_url(db: str | Path) -> str:
    """A SQLAlchemy URL for ``db``: a path becomes a SQLite file URL; ``postgresql://`` and
    ``postgres://`` URLs get the psycopg (v3) driver, the one flowtrial installs."""
    s = str(db)
    if "://" not in s:
        return f"sqlite:///{Path(s).expanduser().resolve()}"
    scheme, rest = s.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    return s


def display_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    if url.startswith("sqlite"):
        return url
    return make_url(url).render_as_string(hide_password=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed cycle survives power loss too; group commit amortizes the fsync.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def create_db_engine(db: str | Path, *, pooled: bool = False) -> Engine:
    """Engine for a path or URL; SQLite gets WAL and a busy timeout.

    ``pooled=True`` keeps SQLite connections open between uses (a long-running writer or
    reader, e.g. the proxy: reopening costs ~2 ms CPU per commit); the default opens one per
    use, so no file handle outlives the work.
    """
    url = database_url(db)
    if url.startswith("sqlite"):
        pool: dict[str, Any] = {"pool_size": 4, "max_overflow": 8} if pooled else {
            "poolclass": NullPool}
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 10}, **pool
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if not url.startswith("postgresql"):
        raise StorageError(
            f"{display_url(url)}: unsupported database: use a SQLite file path or a "
            "postgresql://user@host/dbname URL")
    from .extras import require

    require("postgres", f"the database {display_url(url)}")
    # pre_ping: a connection the server dropped (restart, failover) is replaced, not used.
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def _read_version(engine: Engine) -> int | None:
    try:
        return _read_version_raw(engine)
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StorageError(
            f"{engine.url.render_as_string(hide_password=True)}: cannot "
            f"open the database ({reason}): check the URL and that the server is running"
        ) from exc


def _read_version_raw(engine: Engine) -> int | None:
    if not inspect(engine).has_table("meta"):
        return None
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT value FROM meta WHERE key = 'schema_version'")
        ).first()
    return int(row[0]) if row else None


@dataclass
class Database:
    """An open study database."""

    url: str
    engine: Engine

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def study(self) -> Study | None:
        with self.session() as s:
            return s.exec(select(Study)).scalars().first()  # type: ignore[call-overload]

    def config(self) -> StudyConfig:
        """The study configuration stored when the database was created."""
        st = self.study()
        if st is None:
            raise StorageError(f"{display_url(self.url)}: no study in this database")
        return parse_study(json.loads(st.config_json), source=self.url)

    def time_scale(self) -> float:
        st = self.study()
        return st.time_scale if st else 1.0

    def dispose(self) -> None:
        self.engine.dispose()


_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_path(path: Path, must_exist: bool) -> None:
    """Refuse, in one line, a path that cannot be a study database: missing (when it must
    exist), in a folder that does not exist, a folder, unreadable, or another kind of file."""
    if path.is_dir():
        raise StorageError(f"{path}: a folder, not a database: give the study database's "
                           "file path (e.g. study.db)")
    if not path.exists():
        if must_exist:
            raise StorageError(f"{path}: no such database: create it with `flowtrial enroll "
                               "--study …` or `flowtrial simulate`")
        if not path.parent.is_dir():
            raise StorageError(f"{path.parent}: no such folder for the new database: create "
                               f"it first (mkdir -p {path.parent}) or correct the path")
        return
    try:
        with path.open("rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise StorageError(f"{path}: cannot read it ({exc.strerror}): check its permissions"
                           ) from None
    if header and header != _SQLITE_HEADER:
        raise StorageError(f"{path}: not a database (not a SQLite file): give the study "
                           "database's path, e.g. the --db given to `flowtrial enroll`")


def open_db(db: str | Path, *, must_exist: bool = True) -> Database:
    """Open a study database, checking that its schema version is the one we speak."""
    url = database_url(db)
    if url.startswith("sqlite:///"):
        _check_sqlite_path(Path(url.removeprefix("sqlite:///")), must_exist)
    engine = create_db_engine(url)
    version = _read_version(engine)
    if version is None and must_exist:
        raise StorageError(f"{display_url(url)}: not a flowtrial database (no schema version)")
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(
            f"{display_url(url)}: database schema version {version}, but this flowtrial uses "
            f"{SCHEMA_VERSION}: upgrade flowtrial (pip install -U flowtrial) to open it"
        )
    if version is not None and version < SCHEMA_VERSION:
        upgrade(engine)
    return Database(url=url, engine=engine)


def init_db(db: str | Path, config: StudyConfig, config_toml: str | None = None) -> Database:
    """Create (or reopen) the database for ``config``.

    Reopening checks that the database belongs to the same study and that nothing that
    fixes the randomization (seed, design, arms, per-prompt ranges) has changed.
    """
    database = open_db(db, must_exist=False)
    if _read_version(database.engine) is None:
        with database.engine.begin() as conn:
            SQLModel.metadata.create_all(
                conn, tables=[t.__table__ for t in TABLES])  # type: ignore[attr-defined]
            conn.execute(Meta.__table__.insert().values(  # type: ignore[attr-defined]
                key="schema_version", value=str(SCHEMA_VERSION)))
            stamp_head(conn)
    with database.session() as s:
        existing = s.exec(select(Study)).scalars().first()  # type: ignore[call-overload]
        if existing is None:
            s.add(
                Study(
                    name=config.study.name,
                    seed=config.study.seed,
                    design=config.study.design,
                    unit=str(config.study.unit),
                    time_scale=config.study.time_scale,
                    config_json=config.model_dump_json(),
                    config_toml=config_toml,
                    randomization_fingerprint=config.randomization_fingerprint(),
                    created_at=utcnow(),
                )
            )
            for a in config.allocated_arms:  # per-prompt: none (docs: the study file)
                s.add(
                    Arm(
                        name=a.name,
                        ttft_ms=a.ttft_ms,
                        tokens_per_second=a.tokens_per_second,
                        jitter=a.jitter,
                        delivery=a.delivery,
                        weight=a.weight,
                        shaped=a.shaped,
                    )
                )
        else:
            if existing.name != config.study.name:
                raise StorageError(
                    f"{display_url(database.url)}: belongs to study {existing.name!r}, not "
                    f"{config.study.name!r}: use another --db"
                )
            if existing.randomization_fingerprint != config.randomization_fingerprint():
                raise StorageError(
                    f"{display_url(database.url)}: the study file's seed, design, arms or "
                    "per-prompt ranges changed since this database was created: start a new "
                    "database (changing them mid-study breaks the randomization)"
                )
            # Capture/proxy settings may evolve; keep the stored copy current.
            existing.config_json = config.model_dump_json()
            if config_toml is not None:
                existing.config_toml = config_toml
            s.add(existing)
        s.commit()
    return database


# --------------------------------------------------------------------------- writer


@dataclass
class WriteBatch:
    """Rows for one table. ``ignore_conflicts`` makes re-inserts no-ops (idempotent imports);
    ``upsert`` replaces a row with the same primary key (the proxy's turn rows); ``update``
    sets the given columns of the row with the row's primary key, ``delete`` deletes it
    (a turn revision, docs/concepts/turns.md#revising-a-request)."""

    table: Any
    rows: Sequence[dict[str, Any]]
    ignore_conflicts: bool = False
    upsert: bool = False
    update: bool = False
    delete: bool = False


class LazyRow(Sequence[dict[str, Any]]):
    """A one-row batch whose row is built on first use — by the writer thread, so the
    caller (the proxy's event loop, which paces tokens) never spends time on it."""

    __slots__ = ("_build", "_row")

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = build
        self._row: dict[str, Any] | None = None

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        if i not in (0, -1):
            raise IndexError(i)
        if self._row is None:
            self._row = self._build()
        return self._row


def insert_batch(conn: Any, b: WriteBatch) -> None:
    """Insert one batch on an open connection (idempotently if asked)."""
    table = b.table.__table__ if hasattr(b.table, "__table__") else b.table
    if not b.rows:
        return
    if b.upsert:
        _upsert(conn, table, b.rows)
        return
    if b.update or b.delete:
        _update_or_delete(conn, table, b)
        return
    if not b.ignore_conflicts:
        conn.execute(table.insert(), list(b.rows))
        return
    dialect = conn.dialect.name
    stmt: Insert
    if dialect == "sqlite":
        stmt = sqlite_insert(table).on_conflict_do_nothing()
    elif dialect == "postgresql":
        stmt = pg_insert(table).on_conflict_do_nothing()
    else:  # pragma: no cover - other dialects are not supported for imports
        raise StorageError(f"idempotent insert not supported on {dialect}")
    conn.execute(stmt, list(b.rows))


def _update_or_delete(conn: Any, table: Any, b: WriteBatch) -> None:
    """Update (the row's other columns) or delete rows by primary key."""
    from sqlalchemy import and_, bindparam

    keys = [c.name for c in table.primary_key.columns]
    where = and_(*[table.c[k] == bindparam(f"_k_{k}") for k in keys])
    for row in b.rows:
        params = {f"_k_{k}": row[k] for k in keys}
        if b.delete:
            conn.execute(table.delete().where(where), params)
        else:
            conn.execute(table.update().where(where).values(
                {k: v for k, v in row.items() if k not in keys}), params)


def _upsert(conn: Any, table: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Insert, or update the row with the same primary key (SQLite and PostgreSQL)."""
    dialect = conn.dialect.name
    if dialect == "sqlite":
        stmt: Any = sqlite_insert(table)
    elif dialect == "postgresql":
        stmt = pg_insert(table)
    else:  # pragma: no cover - other dialects are not supported
        raise StorageError(f"upsert not supported on {dialect}")
    keys = [c.name for c in table.primary_key.columns]
    stmt = stmt.on_conflict_do_update(index_elements=keys, set_={
        c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys})
    conn.execute(stmt, list(rows))


@dataclass
class _Item:
    batches: list[WriteBatch]
    future: Future[None] = field(default_factory=Future)
    bulk: bool = False

    @property
    def rows(self) -> int:
        return sum(len(b.rows) for b in self.batches)


_STOP = object()


def _merge(batches: list[WriteBatch]) -> list[WriteBatch]:
    """One executemany per table (and column set) for a whole group commit.

    Rows of many cycles committed together cost one INSERT statement, not one each. Groups
    keep the order in which their table first appears, so parents queued before children
    (a participant before its assignments) are still inserted first.
    """
    groups: dict[tuple[Any, bool, bool, bool, bool, frozenset[str]], list[dict[str, Any]]] = {}
    for b in batches:
        for row in b.rows:
            groups.setdefault((b.table, b.ignore_conflicts, b.upsert, b.update, b.delete,
                               frozenset(row)), []).append(row)
    out = []
    for (t, ignore, upsert, update, delete, _), rows in groups.items():
        if upsert:  # one row per key, the latest: a statement may not update a row twice
            table = t.__table__ if hasattr(t, "__table__") else t
            keys = [c.name for c in table.primary_key.columns]
            rows = list({tuple(r[k] for k in keys): r for r in rows}.values())
        out.append(WriteBatch(t, rows, ignore, upsert, update, delete))
    return out


class RecordWriter:
    """One thread owns all writes; callers get a Future that resolves once rows are durable.

    Items queued while a commit is in flight are committed together in the next transaction
    (group commit), so many concurrent streams cost one fsync, not one each. A failed commit
    fails every future in it: the caller must then not pretend the record exists.

    ``on_start``: called first thing in the writer thread (its owner's tuning, e.g. the
    proxy's thread priority: :mod:`flowtrial.instrumentation.proxy.runtime_tuning`).

    Two priorities: ``submit(..., bulk=True)`` (uploads: events, telemetry) waits while
    anything else is queued and is committed in transactions of at most ``bulk_rows`` rows
    (an item larger than that alone), so a cycle's row waits at most one such transaction
    behind bulk ingest. ``bulk_pending_rows`` is what bulk callers have queued (their
    admission control reads it).
    """

    def __init__(self, engine: Engine, max_batch: int = 2000, name: str = "flowtrial-writer",
                 on_start: Callable[[], None] | None = None, bulk_rows: int = 500):
        self.engine = engine
        self.max_batch = max_batch
        self.bulk_rows = bulk_rows
        self.on_start = on_start
        self._queue: queue.Queue[Any] = queue.Queue()
        self._bulk: deque[_Item] = deque()  # only the writer thread touches it
        self._bulk_lock = threading.Lock()
        self.bulk_pending_rows = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self.commits = 0
        self.rows_written = 0
        self.last_error: BaseException | None = None
        self._thread.start()

    def submit(self, *batches: WriteBatch, bulk: bool = False) -> Future[None]:
        """Queue rows; the returned future resolves when they are committed. ``bulk``: after
        everything else (class docstring)."""
        item = _Item(list(batches), bulk=bulk)
        if self._closed:
            item.future.set_exception(StorageError("record writer is closed"))
            return item.future
        if bulk:
            with self._bulk_lock:
                self.bulk_pending_rows += item.rows
        self._queue.put(item)
        return item.future

    def write(self, *batches: WriteBatch, timeout: float | None = 30.0) -> None:
        """Submit and wait (for code that is not on a latency-sensitive path)."""
        self.submit(*batches).result(timeout=timeout)

    def _commit(self, items: list[_Item]) -> None:
        try:
            with self.engine.begin() as conn:
                for b in _merge([b for it in items for b in it.batches]):
                    insert_batch(conn, b)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the callers
            if len(items) > 1 and not isinstance(exc, OperationalError):
                # One bad item must not fail its neighbours: retry them one by one. Not when
                # the database itself failed (locked, full, gone): each retry would wait out
                # the busy timeout again before the callers hear anything.
                for it in items:
                    self._commit([it])
                return
            self.last_error = exc
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        self.commits += 1
        for it in items:
            self.rows_written += sum(len(b.rows) for b in it.batches)
            if not it.future.done():
                it.future.set_result(None)

    def _run(self) -> None:
        if self.on_start is not None:
            self.on_start()
        stopping = False
        while True:
            items: list[_Item] = []
            if not self._bulk and not stopping:
                first = self._queue.get()  # nothing to do but wait
                if first is _STOP:
                    stopping = True
                else:
                    self._sort(first, items)
            while not stopping and len(items) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                self._sort(nxt, items)
            if items:
                self._commit(items)
            elif self._bulk:
                self._commit_bulk()
            elif stopping:
                return

    def _sort(self, item: _Item, items: list[_Item]) -> None:
        if item.bulk:
            self._bulk.append(item)
        else:
            items.append(item)

    def _commit_bulk(self) -> None:
        """One transaction of bulk items, at most ``bulk_rows`` rows (or one larger item)."""
        chunk = [self._bulk.popleft()]
        rows = chunk[0].rows
        while self._bulk and rows + self._bulk[0].rows <= self.bulk_rows:
            chunk.append(self._bulk.popleft())
            rows += chunk[-1].rows
        try:
            self._commit(chunk)
        finally:
            with self._bulk_lock:
                self.bulk_pending_rows -= rows

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._bulk)


def write_rows(database: Database, batches: Iterable[WriteBatch]) -> None:
    """Write batches in one transaction, synchronously (CLI and simulator paths)."""
    with database.engine.begin() as conn:
        for b in batches:
            insert_batch(conn, b)


def migrate_database(db: str) -> tuple[int, int]:
    """Bring the study database at ``db`` (path or URL) to this flowtrial's schema; returns
    (version before, version after). Opening a database does this too; the command lets
    an operator do it once, before starting several proxies."""
    url = database_url(db)
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            raise StorageError(f"{db}: no such database: nothing to migrate")
        _check_sqlite_path(path, must_exist=True)
    engine = create_db_engine(url)
    try:
        before = _read_version(engine)
        if before is None:
            raise StorageError(f"{db}: not a flowtrial database (no schema version)")
        open_db(url).dispose()  # refuses newer versions, upgrades older ones
        return before, SCHEMA_VERSION
    finally:
        engine.dispose()
