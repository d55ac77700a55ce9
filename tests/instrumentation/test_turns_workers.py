"""Agent turns across proxy processes: with ``flowtrial proxy --workers 2`` the calls of one
turn land on both workers, and each continuation still joins its turn (the tracker reads the
conversation's latest turn from the shared database before the upstream call). Several
people work at once, each running one turn after another."""

from __future__ import annotations

import signal
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from flowtrial.study.config import load_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import open_db
from flowtrial.study.turns import rebuild_turns
from tests.instrumentation.test_proxy_process import setup_study, start_proxy, wait_healthy
from tests.instrumentation.test_proxy_workers import _wait_children

STUDY = """
[study]
name = "turns-workers"
design = "per_prompt"
seed = 5
[per_prompt]
ttft_ms = {min = 20, max = 40}
[upstream]
tool_steps = 3
[upstream.mock]
tokens_per_second = 20000
ttft_ms = 1
"""
TOOL = {"type": "function", "function": {
    "name": "list_dir", "description": "List a directory.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}
PEOPLE, EACH, STEPS = 4, 3, 3  # people in parallel, turns one after another, tool calls
TURNS = PEOPLE * EACH
_COLUMNS = ("id, first_cycle_id, last_cycle_id, model_calls, tool_calls, side_calls, "
            "retries, status, t_start_ns, t_end_ns, wait_ms, model_ms, tool_ms, gap_ms")


def _turn(url: str | list[str], key: str, i: int) -> int:
    """One agent turn; every request on a fresh connection (the kernel picks a worker), or,
    given several proxies' URLs, each call to the next proxy in turn."""
    urls = [url] if isinstance(url, str) else url
    http = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
    clients = [openai.OpenAI(base_url=u + "/v1", api_key=key, max_retries=0, http_client=http)
               for u in urls]
    messages: list[dict] = [{"role": "user", "content": f"What is in folder {i}?"}]
    calls = 0
    while True:
        r = clients[calls % len(clients)].chat.completions.create(
            model="flowtrial-sim-1", messages=messages, tools=[TOOL])
        calls += 1
        msg = r.choices[0].message
        if not msg.tool_calls:
            http.close()
            return calls
        messages += [msg.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": t.id, "content": "a.py b.py"}
            for t in msg.tool_calls]


def _person(url: str, key: str, who: int) -> list[int]:
    return [_turn(url, key, who * 100 + i) for i in range(EACH)]


def test_continuations_join_their_turn_across_workers(tmp_path: Path) -> None:
    study, db, key = setup_study(tmp_path, STUDY)
    database = open_db(db)
    keys = [key] + [enroll(database, load_study(study), f"p{i + 2:02d}")[1]
                    for i in range(PEOPLE - 1)]
    database.dispose()
    proc, url = start_proxy(study, db, "--workers", "2", "--instance", "site")
    try:
        wait_healthy(url)
        _wait_children(proc.pid, 2)
        with ThreadPoolExecutor(PEOPLE) as pool:
            calls = sum(pool.map(lambda i: _person(url, keys[i], i), range(PEOPLE)), [])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert calls == [STEPS + 1] * TURNS
    con = sqlite3.connect(db)
    cycles = con.execute("SELECT id, turn_id, request_kind, recorded_by, conversation_key "
                         "FROM cycles ORDER BY t_request_ns").fetchall()
    turns = con.execute(f"SELECT {_COLUMNS} FROM turns ORDER BY id").fetchall()
    con.close()
    assert len(cycles) == TURNS * (STEPS + 1)
    by_turn: dict[str, list[tuple]] = {}
    for c in cycles:
        by_turn.setdefault(c[1], []).append(c)
    # One turn per conversation, holding its human request and all three continuations...
    assert len(by_turn) == TURNS and len({c[4] for c in cycles}) == TURNS
    for rows in by_turn.values():
        assert [r[2] for r in rows] == ["human"] + ["continuation"] * STEPS
        assert len({r[4] for r in rows}) == 1
    # ... though both workers served calls of the same turns.
    assert {c[3] for c in cycles} == {"site/0", "site/1"}
    assert sum(len({r[3] for r in rows}) == 2 for rows in by_turn.values()) >= 1
    assert len(turns) == TURNS
    for t in turns:  # each turn row counts every call, whichever worker wrote it last
        assert t[3] == STEPS + 1 and t[4] == STEPS and t[7] == "complete", t
        assert t[12] > 0  # tool time between the calls
    database = open_db(db)
    try:
        assert rebuild_turns(database) == TURNS
    finally:
        database.dispose()
    con = sqlite3.connect(db)
    again = con.execute(f"SELECT {_COLUMNS} FROM turns ORDER BY id").fetchall()
    con.close()
    assert again == turns



def test_two_proxies_on_one_postgresql_alternating_calls(tmp_path: Path, pg_server) -> None:
    """Two `flowtrial proxy` processes on one PostgreSQL database; every call of a turn goes
    to the other proxy than the call before it."""
    from flowtrial.study.storage import init_db

    url = pg_server.new_database()
    study = tmp_path / "study.toml"
    study.write_text(STUDY, encoding="utf-8")
    config = load_study(study)
    database = init_db(url, config, STUDY)
    key = enroll(database, config, "p01")[1]
    database.dispose()
    procs = [start_proxy(study, url, "--instance", f"proxy{k}") for k in range(2)]
    try:
        for _, u in procs:
            wait_healthy(u)
        calls = [_turn([u for _, u in procs], key, i) for i in range(3)]
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    assert calls == [STEPS + 1] * 3
    database = open_db(url)
    try:
        with database.engine.connect() as c:
            cycles = c.exec_driver_sql("SELECT turn_id, request_kind, recorded_by FROM cycles "
                                       "ORDER BY started_at").fetchall()
            turns = c.exec_driver_sql(f"SELECT {_COLUMNS} FROM turns ORDER BY id").fetchall()
        assert [r[2] for r in cycles] == ["proxy0", "proxy1"] * (2 * 3)
        assert [r[1] for r in cycles] == (["human"] + ["continuation"] * STEPS) * 3
        assert len({r[0] for r in cycles}) == len(turns) == 3
        assert all(t[3] == STEPS + 1 and t[4] == STEPS and t[7] == "complete" for t in turns)
        assert rebuild_turns(database) == 3
        with database.engine.connect() as c:
            again = c.exec_driver_sql(f"SELECT {_COLUMNS} FROM turns ORDER BY id").fetchall()
        assert again == turns
    finally:
        database.dispose()
