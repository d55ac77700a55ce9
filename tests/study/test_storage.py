"""Schema round-trip, version and study checks, the group-commit writer — on SQLite and on a
real PostgreSQL server (``both_backends``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from flowtrial.study import keys
from flowtrial.study.participants import EnrollmentError, enroll, participant_by_key
from flowtrial.study.schema import SCHEMA_VERSION, Cycle, Event, Meta
from flowtrial.study.storage import RecordWriter, StorageError, WriteBatch, init_db, open_db

from .conftest import make_config

pytestmark = pytest.mark.both_backends


def cycle_row(pid: str, i: int) -> dict:
    return {
        "id": f"c{i:06d}", "participant_id": pid, "arm": "per_prompt", "protocol": "chat",
        "mono_anchor_ns": 5, "wall_anchor_ns": 1_800_000_000_000_000_000,
        "t_request_ns": 1_000 + i, "t_first_sent_ns": 2_000_000_000 + i,
        "t_last_sent_ns": 9_000_000_000_000 + i, "started_at": datetime.now(UTC),
        "target_ttft_ms": 200.0, "status": "ok", "stream": True, "turn": 1, "shaped": True,
        "violation": False, "usage_exact": True, "tool_calls": 0, "simulated": False,
        "transport": "http", "upstream": "mock",
    }


def test_schema_round_trip(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    cfg = make_config()
    db = init_db(where, cfg)
    p, key, _ = enroll(db, cfg, "p01")
    if db.engine.dialect.name == "sqlite":
        with db.engine.connect() as c:
            assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    writer = RecordWriter(db.engine)
    writer.write(WriteBatch(Cycle, [cycle_row("p01", 1)]))
    writer.close()
    again = open_db(where)
    with again.session() as s:
        c = s.get(Cycle, "c000001")
        assert c is not None and c.t_last_sent_ns == 9_000_000_000_001  # 64-bit ns survive
        assert s.get(Meta, "schema_version").value == str(SCHEMA_VERSION)
    assert again.config() == cfg
    assert again.study().name == cfg.study.name
    # The key is never stored, only its salted hash; it still authenticates.
    with again.session() as s:
        row = s.execute(text("SELECT * FROM participants")).mappings().one()
    assert key not in json.dumps({k: str(v) for k, v in row.items()})
    assert row["key_hash"] == keys.hash_secret(keys.split_key(key)[1], row["key_salt"])
    assert participant_by_key(again, key).id == "p01"
    assert participant_by_key(again, key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert participant_by_key(again, "sk-not-ours") is None


def test_other_schema_version_is_refused(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    db = init_db(where, make_config())
    with db.engine.begin() as c:
        c.execute(text("UPDATE meta SET value = '99' WHERE key = 'schema_version'"))
    with pytest.raises(StorageError, match="schema version 99, but this flowtrial uses"):
        open_db(where)


def test_missing_database_and_wrong_study(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    missing = where.rsplit("/", 1)[0] + "/nonexistent" if isinstance(where, str) else (
        where.parent / "none.db")
    with pytest.raises(StorageError, match="no such database|cannot open the database"):
        open_db(missing)
    init_db(where, make_config())
    with pytest.raises(StorageError, match="belongs to study 'flow-threshold-pilot'"):
        init_db(where, make_config(name="other"))
    with pytest.raises(StorageError, match="changed since this database was created"):
        init_db(where, make_config(seed=5))


def test_duplicate_enrollment_and_bad_ids(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    cfg = make_config()
    db = init_db(where, cfg)
    enroll(db, cfg, "p01")
    with pytest.raises(EnrollmentError, match="already enrolled"):
        enroll(db, cfg, "p01")
    with pytest.raises(EnrollmentError, match="not valid"):
        enroll(db, cfg, "alice@example.com")


def test_group_commit_from_many_threads(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    cfg = make_config()
    db = init_db(where, cfg)
    enroll(db, cfg, "p01")
    writer = RecordWriter(db.engine)
    futures = []
    lock = threading.Lock()

    def submit(start: int) -> None:
        for i in range(start, start + 250):
            f = writer.submit(WriteBatch(Cycle, [cycle_row("p01", i)]))
            with lock:
                futures.append(f)

    threads = [threading.Thread(target=submit, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result(timeout=30)
    writer.close()
    with db.session() as s:
        assert s.execute(select(func.count()).select_from(Cycle)).scalar_one() == 1000
    assert writer.commits < 1000  # rows queued during a commit share the next one


def test_failed_write_fails_only_its_own_future(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    cfg = make_config()
    db = init_db(where, cfg)
    enroll(db, cfg, "p01")
    writer = RecordWriter(db.engine)
    good = writer.submit(WriteBatch(Cycle, [cycle_row("p01", 1)]))
    bad = writer.submit(WriteBatch(Cycle, [cycle_row("nobody", 2)]))  # FK violation
    dup = writer.submit(WriteBatch(Cycle, [cycle_row("p01", 1)]))  # primary-key clash
    good.result(10)
    with pytest.raises(Exception, match="FOREIGN KEY|foreign key"):
        bad.result(10)
    with pytest.raises(Exception, match="UNIQUE|duplicate key"):
        dup.result(10)
    writer.close()
    with pytest.raises(StorageError, match="closed"):
        writer.submit(WriteBatch(Cycle, [])).result(1)


def test_idempotent_event_insert(new_db: Callable[[str], str | Path]) -> None:
    where = new_db("s.db")
    cfg = make_config()
    db = init_db(where, cfg)
    enroll(db, cfg, "p01")
    writer = RecordWriter(db.engine)
    ev = {"participant_id": "p01", "kind": "focus_out", "ts_ns": 1, "source": "activitywatch",
          "dedupe_key": "aw:1", "received_at": datetime.now(UTC)}
    writer.write(WriteBatch(Event, [ev], ignore_conflicts=True))
    writer.write(WriteBatch(Event, [ev], ignore_conflicts=True))
    writer.close()
    with db.session() as s:
        assert s.execute(select(func.count()).select_from(Event)).scalar_one() == 1


def test_group_commit_merges_rows_but_keeps_tables_in_order(
        new_db: Callable[[str], str | Path]) -> None:
    """Rows of many items share one INSERT per table and column set; a parent queued before
    its children (participant, then its assignment) is still inserted first."""
    where = new_db("s.db")
    from flowtrial.study.schema import Assignment, Participant
    from flowtrial.study.storage import _merge

    now = datetime.now(UTC)
    part = {"id": "p9", "key_id": "k9", "key_salt": "s", "key_hash": "h", "enrolled_index": 9,
            "created_at": now, "simulated": True}
    assign = {"participant_id": "p9", "period": 0, "arm": "fast", "created_at": now}
    ev1 = {"participant_id": "p9", "kind": "accept", "ts_ns": 1, "source": "client",
           "received_at": now}
    ev2 = {**ev1, "ts_ns": 2, "duration_s": 1.5}  # another column set
    merged = _merge([WriteBatch(Participant, [part]), WriteBatch(Event, [ev1]),
                     WriteBatch(Assignment, [assign]), WriteBatch(Event, [ev2, ev1])])
    assert [(b.table, len(b.rows)) for b in merged] == [
        (Participant, 1), (Event, 2), (Assignment, 1), (Event, 1)]
    cfg = make_config()
    db = init_db(where, cfg)
    writer = RecordWriter(db.engine)
    writer.write(WriteBatch(Participant, [part]), WriteBatch(Event, [ev1]),
                 WriteBatch(Assignment, [assign]), WriteBatch(Event, [ev2]))
    writer.close()
    with db.session() as s:
        assert s.execute(select(func.count()).select_from(Event)).scalar_one() == 2
        assert s.execute(select(func.count()).select_from(Assignment)).scalar_one() == 1


def test_writer_runs_its_thread_start_hook_in_the_writer_thread(tmp_path: Path) -> None:
    """``on_start`` runs first thing in the writer's own thread (the owner's tuning)."""
    cfg = make_config()
    db = init_db(tmp_path / "s.db", cfg)
    enroll(db, cfg, "p01")
    seen: list[int] = []
    writer = RecordWriter(db.engine, on_start=lambda: seen.append(threading.get_native_id()))
    try:
        writer.write(WriteBatch(Cycle, [cycle_row("p01", 1)]))
        assert seen == [writer._thread.native_id]
        assert seen[0] != threading.get_native_id()
    finally:
        writer.close()


def test_bulk_rows_wait_behind_the_token_paths(tmp_path: Path) -> None:
    """Uploads (bulk) queued before a cycle's row are committed after it, in transactions of
    at most ``bulk_rows`` rows; ``bulk_pending_rows`` counts what waits."""
    import sqlite3

    cfg = make_config()
    db = init_db(tmp_path / "s.db", cfg)
    enroll(db, cfg, "p01")
    writer = RecordWriter(db.engine, bulk_rows=150)
    done: list[str] = []
    lock = threading.Lock()

    def note(name: str) -> Callable[[object], None]:
        def cb(_: object) -> None:
            with lock:
                done.append(name)
        return cb

    blocker = sqlite3.connect(tmp_path / "s.db", timeout=10)
    blocker.execute("BEGIN EXCLUSIVE")  # the writer's first commit waits on this
    first = writer.submit(WriteBatch(Cycle, [cycle_row("p01", 0)]))
    first.add_done_callback(note("cycle0"))
    time_rows = [{"participant_id": "p01", "kind": "custom", "ts_ns": i, "source": "client",
                  "received_at": datetime.now(UTC)} for i in range(100)]
    bulk = [writer.submit(WriteBatch(Event, time_rows), bulk=True) for _ in range(4)]
    for k, f in enumerate(bulk):
        f.add_done_callback(note(f"bulk{k}"))
    assert writer.bulk_pending_rows == 400
    cycle = writer.submit(WriteBatch(Cycle, [cycle_row("p01", 1)]))
    cycle.add_done_callback(note("cycle1"))
    blocker.rollback()
    blocker.close()
    for f in [first, cycle, *bulk]:
        f.result(timeout=30)
    writer.close()
    assert done[:2] == ["cycle0", "cycle1"], done  # the cycle queued last went first
    assert sorted(done[2:]) == [f"bulk{k}" for k in range(4)]
    assert writer.bulk_pending_rows == 0
    # The cycles in one or two transactions (as the writer woke), then one per bulk item
    # (150-row chunks hold one 100-row item each).
    assert writer.commits in (1 + 4, 2 + 4)
