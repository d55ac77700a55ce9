"""Caps that hold across ``flowtrial proxy --workers 2`` (issue #28): pre-authentication
connections per client address and in total, the daily stored-bytes quota and one
participant's share of ingest. As in the WebSocket cap's test, one worker is stopped
(SIGSTOP) so the other takes every new connection: what worker A counted must be seen by B."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.instrumentation.test_proxy_process import setup_study, start_proxy, wait_healthy
from tests.instrumentation.test_proxy_workers import PER_PROMPT, _children, _wait_children

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"  # no blank line: still pre-auth


@contextmanager
def _two_workers(tmp_path: Path, proxy: str) -> Iterator[tuple[str, str, int, int, int]]:
    """A proxy with 2 workers and ``proxy`` settings: (url, key, supervisor, worker a, b)."""
    study, db, key = setup_study(tmp_path, PER_PROMPT.replace(
        "[upstream.mock]", f"[proxy]\n{proxy}\n[upstream.mock]"))
    proc, url = start_proxy(study, db, "--workers", "2")
    a = b = 0
    try:
        wait_healthy(url)
        a, b = sorted(_wait_children(proc.pid, 2))
        yield url, key, proc.pid, a, b
    finally:
        for pid in (a, b):
            if pid:
                for p in _descendants(pid) | {pid}:
                    os.kill(p, signal.SIGCONT)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for kid in _children(todo.pop()):
            out.add(kid)
            todo.append(kid)
    return out


def _only(serving: int, stopped: int) -> None:
    """Every new connection goes to worker ``serving``."""
    os.kill(stopped, signal.SIGSTOP)
    os.kill(serving, signal.SIGCONT)
    time.sleep(0.3)


def _half_open(url: str, source: str, socks: list[socket.socket]) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
    s.sendall(HEAD)
    socks.append(s)
    return s


def _evicted(s: socket.socket, wait_s: float = 3.0) -> bool:
    """Whether the proxy answered 408 on this half-open connection within ``wait_s``."""
    s.settimeout(wait_s)
    try:
        return s.recv(64).startswith(b"HTTP/1.1 408")
    except TimeoutError:
        return False


def test_preauth_caps_hold_across_workers(tmp_path: Path) -> None:
    """Three half-open connections from 127.0.0.1 held by worker A fill that address's cap
    of 3 for worker B too; five in all fill the total, and B then closes its oldest."""
    socks: list[socket.socket] = []
    with _two_workers(tmp_path, "max_preauth_per_client = 3\nmax_preauth_connections = 5\n"
                      "header_timeout_s = 30") as (url, _key, _sup, a, b):
        try:
            _only(a, b)
            held = [_half_open(url, "127.0.0.1", socks) for _ in range(3)]
            time.sleep(0.5)  # accepted by A
            _only(b, a)
            assert _evicted(_half_open(url, "127.0.0.1", socks)), "per-address cap per worker"
            others = [_half_open(url, "127.0.0.2", socks) for _ in range(2)]  # 5 in all
            time.sleep(0.5)
            assert not any(_evicted(s, 0.2) for s in others)
            _half_open(url, "127.0.0.3", socks)  # the sixth: B closes its oldest
            assert _evicted(others[0])
            os.kill(a, signal.SIGCONT)
            assert not any(_evicted(s, 0.2) for s in held)  # A's stay within the caps
        finally:
            for s in socks:
                s.close()


def _post_events(url: str, key: str, n_chars: int) -> httpx.Response:
    """One event upload on a connection of its own (so a stopped worker never holds it)."""
    with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        return c.post(url + "/flowtrial/v1/events", headers={"authorization": f"Bearer {key}"},
                      json={"events": [{"kind": "custom", "payload": {"t": "x" * n_chars}}]})


def test_daily_quota_holds_across_workers(tmp_path: Path) -> None:
    """Worker B counts one upload; worker A then stores up to the day's cap; B must refuse
    the next (counted per worker, B would still see one upload's worth and store it)."""
    with _two_workers(tmp_path, "max_stored_bytes_per_day = 20000\nmax_payload_bytes = 8192"
                      ) as (url, key, _sup, a, b):
        _only(b, a)
        assert _post_events(url, key, 3000).status_code == 200  # B seeds its count
        _only(a, b)
        codes = [_post_events(url, key, 3000).status_code for _ in range(8)]
        assert 200 in codes and codes[-1] == 429, codes  # A reached the cap
        _only(b, a)
        r = _post_events(url, key, 3000)
        assert r.status_code == 429 and r.json()["error"]["code"] == "daily_quota", r.text
        assert int(r.headers["retry-after"]) > 0


def test_ingest_share_holds_across_workers(tmp_path: Path) -> None:
    """With ``ingest_per_participant = 1``, an upload held in worker A's (stopped) ingest
    process takes the participant's share: worker B answers 429 too_many_uploads."""
    settings = "ingest_per_participant = 1\ningest_workers = 1"
    with _two_workers(tmp_path, settings) as (url, key, _sup, a, b), \
            ThreadPoolExecutor(1) as pool:
        _only(a, b)
        deadline = time.monotonic() + 60  # a big upload starts A's ingest processes
        while not _descendants(a):
            assert time.monotonic() < deadline
            assert _post_events(url, key, 100_000).status_code == 200
        for _ in range(2):  # the fork server and its one ingest process now up
            assert _post_events(url, key, 100_000).status_code == 200
        ingest = _descendants(a)
        assert len(ingest) >= 2, ingest
        for p in ingest:
            os.kill(p, signal.SIGSTOP)
        held = pool.submit(_post_events, url, key, 100_000)  # admitted by A, then stuck
        time.sleep(1.0)
        assert not held.done()
        _only(b, a)
        r = _post_events(url, key, 10)
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_uploads", r.text
        for p in ingest:
            os.kill(p, signal.SIGCONT)
        os.kill(a, signal.SIGCONT)
        assert held.result(timeout=60).status_code == 200
        deadline = time.monotonic() + 10  # the share is given back
        while _post_events(url, key, 10).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_shared_sketch_sums_workers_and_never_counts_low() -> None:
    """The address table: a forked worker's counts are seen by the other; with more keys
    than cells, no key's count is ever below its true count."""
    from flowtrial.instrumentation.proxy.shared_counts import SharedSketch

    sketch = SharedSketch(2, width=16)
    sketch.attach(0)
    sketch.add("10.0.0.1", 2)
    pid = os.fork()
    if pid == 0:  # worker 1
        sketch.attach(1)
        ok = sketch.add("10.0.0.1", 1) and sketch.total("10.0.0.1") == 3
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sketch.total("10.0.0.1") == 3
    truth = {f"10.0.1.{i}": i % 5 for i in range(64)}  # 64 keys in 16 cells per row
    for k, n in truth.items():
        sketch.add(k, n)
    assert all(sketch.total(k) >= n for k, n in truth.items())
    sketch.attach(1)  # worker 1 restarted: its part is empty, worker 0's counts stay
    assert all(sketch.total(k) >= n for k, n in truth.items())
    assert sketch.total("10.0.0.1") >= 2
