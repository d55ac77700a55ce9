"""Per-prompt request indices: claimed in blocks from ``draw_counters``, never repeated across
processes, claimed ahead so a request does not wait for a write (on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from flowtrial.instrumentation.proxy.arms import read_engine
from flowtrial.instrumentation.proxy.draw_indices import INDEX_BLOCK, DrawIndices
from flowtrial.study.config import StudyConfig, parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import Database, init_db, open_db

pytestmark = pytest.mark.both_backends

def make_config() -> StudyConfig:
    return parse_study({"study": {"name": "draws", "design": "per_prompt", "seed": 5},
                        "per_prompt": {"ttft_ms": {"min": 100, "max": 400}}})


@pytest.fixture
def database(new_db: Callable[[str], str | Path], backend: str) -> Iterator[Database]:
    config = make_config()
    db = init_db(new_db("draws.db"), config)
    for pid in ("p01", "p02", "p03"):
        enroll(db, config, pid)
    yield db
    db.dispose()


def counters(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        return dict(conn.execute(text("SELECT participant_id, next_index FROM draw_counters")
                                 ).all())


def test_startup_claims_every_participant_in_one_transaction(database: Database) -> None:
    """One transaction at startup gives every enrolled participant a block; the next block
    is claimed in the background once half of one is used, so no request waits for it."""
    half = INDEX_BLOCK // 2

    async def go() -> tuple[list[int], list[int]]:
        d = DrawIndices(read_engine(database))
        await d.start()
        claims = [d.claims]
        got = [await d.next("p02") for _ in range(half - 1)]
        claims.append(d.claims)
        assert "p02" not in d._spare
        got.append(await d.next("p02"))  # half the block is used: the next one is claimed
        await d._spare["p02"]
        claims.append(d.claims)
        got += [await d.next("p02") for _ in range(INDEX_BLOCK - 1)]  # into the spare block
        claims.append(d.claims)
        d.engine.dispose()
        return got, claims

    got, claims = asyncio.run(go())
    assert claims == [1, 1, 2, 2]
    assert got == list(range(INDEX_BLOCK + half - 1))
    assert counters(database) == {"p01": INDEX_BLOCK, "p02": 2 * INDEX_BLOCK,
                                  "p03": INDEX_BLOCK}


def test_processes_interleaving_never_repeat_an_index(database: Database) -> None:
    """Two processes (two resolvers with their own engines) serving one participant, and a
    restart: every index is used once; each process's are whole blocks."""

    async def serve(n: int) -> tuple[list[int], list[int]]:
        a, b = DrawIndices(read_engine(database)), DrawIndices(read_engine(database))
        await a.start()
        await b.start()
        got: tuple[list[int], list[int]] = ([], [])
        for _ in range(n):
            got[0].append(await a.next("p01"))
            got[1].append(await b.next("p01"))
        a.engine.dispose()
        b.engine.dispose()
        return got

    first, second = asyncio.run(serve(2 * INDEX_BLOCK + 3))
    assert not set(first) & set(second)
    assert len(set(first)) == len(first) and len(set(second)) == len(second)
    for got in (first, second):
        assert all(i % INDEX_BLOCK == j % INDEX_BLOCK for j, i in enumerate(got))
    again, _ = asyncio.run(serve(1))  # a restart continues past every block claimed
    assert again[0] > max(first + second)


def test_concurrent_claims_are_disjoint(database: Database) -> None:
    """Threads claiming at once (as separate proxies' claims do): each gets its own block."""
    engines = [read_engine(database) for _ in range(6)]
    starts: list[int] = []
    lock = threading.Lock()

    def claim(d: DrawIndices) -> None:
        for _ in range(5):
            s = d.claim(["p03"])["p03"]
            with lock:
                starts.append(s)

    threads = [threading.Thread(target=claim, args=(DrawIndices(e),)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in engines:
        e.dispose()
    assert sorted(starts) == [i * INDEX_BLOCK for i in range(30)]


def test_concurrent_claims_of_many_participants_do_not_deadlock(database: Database) -> None:
    """Proxies starting at once each claim for every participant, whatever order they list
    them in: every claim completes, and each participant's blocks are disjoint."""
    orders = [["p01", "p02", "p03"], ["p03", "p02", "p01"], ["p02", "p03", "p01"]] * 2
    got: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def claim(order: list[str]) -> None:
        engine = read_engine(database)
        try:
            d = DrawIndices(engine)
            for _ in range(4):
                got.append(d.claim(order))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=claim, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(got) == 24
    for pid in ("p01", "p02", "p03"):
        assert sorted(g[pid] for g in got) == [i * INDEX_BLOCK for i in range(24)]


def test_virtual_simulation_leaves_counters_past_its_draws(
        new_db: Callable[[str], str | Path], backend: str) -> None:
    """A virtual per-prompt simulation drew indices 0 … k-1 for its participants; a proxy
    serving one of them later continues past those."""
    from flowtrial.study.simulator.params import SimParams
    from flowtrial.study.simulator.virtual import simulate_virtual

    config = make_config()
    where = new_db("sim.db")
    db = init_db(where, config)
    res = simulate_virtual(db, config, SimParams(), 3, tasks=2, prompts_per_task=4, seed=1)
    db.dispose()
    db = open_db(where)
    assert counters(db) == {p: 8 for p in res.participants}

    async def first() -> int:
        d = DrawIndices(read_engine(db))
        await d.start()
        i = await d.next(res.participants[0])
        d.engine.dispose()
        return i

    assert asyncio.run(first()) == 8
    db.dispose()
