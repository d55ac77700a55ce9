"""``flowtrial proxy --workers N``: worker processes on one port, one database, draws that
never repeat, shared participant sessions, a supervisor that restarts and drains."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from flowtrial.instrumentation.proxy.draw_indices import INDEX_BLOCK
from flowtrial.study.config import load_study
from flowtrial.study.participants import enroll
from tests.instrumentation.test_proxy_process import setup_study, start_proxy, wait_healthy

PER_PROMPT = """
[study]
name = "workers"
design = "per_prompt"
seed = 3
[per_prompt]
ttft_ms = {min = 60, max = 120}
tokens_per_second = {min = 200, max = 400}
[upstream.mock]
tokens_per_second = 20000
ttft_ms = 1
"""


def _children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(p) for p in text.split()}


def _wait_children(pid: int, n: int, timeout: float = 30) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        kids = _children(pid)
        if len(kids) == n:
            return kids
        assert time.monotonic() < deadline, f"expected {n} workers, have {kids}"
        time.sleep(0.05)


def _chat(url: str, key: str, i: int) -> str:
    """One streaming request on a connection of its own (so the kernel picks a worker)."""
    with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c, \
            c.stream("POST", url + "/v1/chat/completions",
                     headers={"authorization": f"Bearer {key}"},
                     json={"model": "flowtrial-sim-1", "stream": True, "max_tokens": 20,
                           "messages": [{"role": "user", "content": f"python {i}"}]}) as r:
        assert r.status_code == 200
        body = "".join(r.iter_text())
        assert body.rstrip().endswith("data: [DONE]")
        return r.headers["x-flowtrial-cycle-id"]


def test_workers_share_port_database_draws_and_sessions(tmp_path: Path) -> None:
    study, db, key1 = setup_study(tmp_path, PER_PROMPT)
    from flowtrial.study.storage import open_db

    database = open_db(db)
    key2 = enroll(database, load_study(study), "p02")[1]
    database.dispose()
    proc, url = start_proxy(study, db, "--workers", "2", "--instance", "site")
    try:
        wait_healthy(url)
        _wait_children(proc.pid, 2)
        keys = [key1, key2]
        with ThreadPoolExecutor(16) as pool:  # overlapping streams: both workers get some
            ids = list(pool.map(lambda i: _chat(url, keys[i % 2], i), range(64)))

        # A participant-page login made on one connection holds on every later one, whichever
        # worker serves it (the workers share the session secret).
        page = url + "/flowtrial/participant"
        with httpx.Client(timeout=10) as c:
            r = c.post(page + "/login", data={"key": key1})
            assert r.status_code == 303 and "flowtrial_session" in r.cookies
            cookie = r.cookies["flowtrial_session"]
        for _ in range(12):
            with httpx.Client(timeout=10, cookies={"flowtrial_session": cookie}) as c:
                home = c.get(page + "/")
                assert home.status_code == 200 and "p01" in home.text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    con = sqlite3.connect(db)
    marks = ",".join("?" * len(ids))
    rows = con.execute("SELECT id, participant_id, recorded_by, draw_json, status FROM cycles "
                       f"WHERE id IN ({marks})", ids).fetchall()
    con.close()
    assert len(rows) == 64 and {r[4] for r in rows} == {"ok"}
    assert {r[2] for r in rows} == {"site/0", "site/1"}  # both workers served
    for pid in ("p01", "p02"):
        idx = [(json.loads(r[3])["request_index"], r[2]) for r in rows if r[1] == pid]
        assert len({i for i, _ in idx}) == len(idx) == 32  # no draw repeated
        owner: dict[int, str] = {}
        for i, by in idx:  # each block of indices was claimed by one worker
            assert owner.setdefault(i // INDEX_BLOCK, by) == by


def test_supervisor_restarts_a_killed_worker_and_drains_on_sigterm(tmp_path: Path) -> None:
    study, db, key = setup_study(tmp_path)
    proc, url = start_proxy(study, db, "--workers", "2")
    try:
        wait_healthy(url)
        first = _wait_children(proc.pid, 2)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim in _children(proc.pid) or len(_children(proc.pid)) < 2:
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.05)
        wait_healthy(url)
        ids = [_chat(url, key, i) for i in range(10)]  # still serving, on both
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"worker 0 (pid {victim}) ended (signal 9): starting a new one" in err or \
        f"worker 1 (pid {victim}) ended (signal 9): starting a new one" in err, err
    con = sqlite3.connect(db)
    marks = ",".join("?" * len(ids))
    n = con.execute(f"SELECT count(*) FROM cycles WHERE id IN ({marks})", ids).fetchone()[0]
    con.close()
    assert n == 10
    assert not any(Path(f"/proc/{p}").exists() for p in first - {victim})  # all stopped


def test_workers_out_of_range_is_a_clear_error(tmp_path: Path, capsys) -> None:
    from tests.instrumentation.test_proxy_process import run_main

    study, db, _ = setup_study(tmp_path)
    code, err = run_main(["--study", str(study), "--db", str(db), "--workers", "0"], capsys)
    assert code == 2 and "--workers 0 is out of range: use 1-64" in err


def test_shared_counts_hold_across_forked_processes() -> None:
    """Each worker writes only its own part; every worker reads the sum; a restarted worker
    starts its part empty (what a dead one held is gone with it)."""
    from flowtrial.instrumentation.proxy.shared_counts import SharedCounts

    table = SharedCounts(2, slots=64)
    table.attach(0)
    table.add("p01", 2)
    pid = os.fork()
    if pid == 0:  # worker 1
        table.attach(1)
        ok = table.add("p01", 3) and table.total("p01") == 5 and table.total("p02") == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert table.total("p01") == 5  # the child's increments are visible here
    table.add("p01", -5)  # never below zero in this part
    assert table.total("p01") == 3
    table.attach(1)  # worker 1 restarted
    assert table.total("p01") == 0
    keys = [f"k{i}" for i in range(64)]
    assert all(table.add(k, 1) for k in keys)  # a full part ...
    assert not table.add("one-more", 1) and table.total("one-more") == 0  # ... says so
    assert sum(table.total(k) for k in keys) == 64  # no key counted under another's slot


def _ws_status(host: str, port: int, key: str, socks: list[Any]) -> str:
    """Open a Responses WebSocket (kept open in ``socks``); the handshake's status."""
    import base64
    import socket

    s = socket.create_connection((host, port), timeout=10)
    socks.append(s)
    nonce = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               f"Sec-WebSocket-Key: {nonce}\r\nAuthorization: Bearer {key}\r\n\r\n").encode())
    return s.recv(200).split(b" ", 2)[1].decode()


def test_websockets_per_participant_hold_across_workers(tmp_path: Path) -> None:
    """``proxy.max_websockets_per_participant`` is one cap for all workers, not one each: with
    one worker stopped (SIGSTOP) the other takes every connection, so the sockets held by
    worker A are seen by worker B."""
    study, db, key = setup_study(tmp_path, PER_PROMPT.replace(
        "[upstream.mock]", "[proxy]\nmax_websockets_per_participant = 3\n[upstream.mock]"))
    proc, url = start_proxy(study, db, "--workers", "2")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    socks: list[Any] = []
    a = b = 0
    try:
        wait_healthy(url)
        a, b = sorted(_wait_children(proc.pid, 2))
        os.kill(b, signal.SIGSTOP)  # every connection now goes to worker a
        assert [_ws_status(host, int(port), key, socks) for _ in range(4)] == [
            "101", "101", "101", "429"]
        os.kill(b, signal.SIGCONT)
        os.kill(a, signal.SIGSTOP)  # now to worker b, which holds none of the three
        assert [_ws_status(host, int(port), key, socks) for _ in range(2)] == ["429", "429"]
        os.kill(a, signal.SIGCONT)
        for s in socks:
            s.close()
        socks.clear()
        deadline = time.monotonic() + 10  # closed sockets are counted down by their worker
        while _ws_status(host, int(port), key, socks) != "101":
            assert time.monotonic() < deadline
            socks.pop().close()
            time.sleep(0.2)
    finally:
        for pid in (a, b):
            if pid:
                os.kill(pid, signal.SIGCONT)
        for s in socks:
            s.close()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
