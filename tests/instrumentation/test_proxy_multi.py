"""Several `flowtrial proxy` processes recording into one PostgreSQL database at once (one per
site, or behind a load balancer): no conflicts, no lost cycles, and kill -9 of one proxy
loses nothing a client saw complete while the other keeps serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import text

from flowtrial.instrumentation.proxy.draw_indices import INDEX_BLOCK
from flowtrial.study.config import load_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db, open_db
from tests.instrumentation.test_proxy_process import start_proxy, wait_healthy
from tests.pg_server import PgServer

STUDY = """
[study]
name = "multi-proxy"
design = "parallel"
[upstream.mock]
tokens_per_second = 20000
ttft_ms = 1
[[arms]]
name = "fast"
ttft_ms = 30
tokens_per_second = 400
[[arms]]
name = "slow"
ttft_ms = 80
tokens_per_second = 200
"""
N_PARTICIPANTS = 12


def start(study: Path, url: str, instance: str) -> tuple[subprocess.Popen[str], str]:
    proc, base = start_proxy(study, url, "--instance", instance)
    wait_healthy(base)
    return proc, base


class Clients:
    """Participants sending streamed prompts round-robin over the proxies (a load balancer
    without stickiness), remembering which streams they saw complete."""

    def __init__(self, keys: list[str], urls: list[str]) -> None:
        self.keys, self.urls = keys, urls
        self.complete: list[str] = []
        self.started: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self, i: int) -> None:
        body = {"model": "flowtrial-sim-1", "stream": True, "max_tokens": 20,
                "messages": [{"role": "user", "content": f"write a python function {i}"}]}
        n = i
        with httpx.Client(timeout=15) as http:
            while not self.stop.is_set():
                url = self.urls[n % len(self.urls)]
                n += 1
                cid, done = "", False
                try:
                    with http.stream("POST", url + "/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {self.keys[i]}"}) as r:
                        cid = r.headers.get("x-flowtrial-cycle-id", "")
                        done = any(line == "data: [DONE]" for line in r.iter_lines())
                except httpx.HTTPError:
                    time.sleep(0.05)  # that proxy is gone: the balancer's next pick
                with self.lock:
                    if cid:
                        self.started.append(cid)
                    if done:
                        self.complete.append(cid)

    def go(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.run, args=(i,)) for i in range(len(self.keys))]
        for t in threads:
            t.start()
        return threads


PER_PROMPT = """
[study]
name = "multi-proxy-per-prompt"
design = "per_prompt"
seed = 11
[upstream.mock]
tokens_per_second = 20000
ttft_ms = 1
[per_prompt]
ttft_ms = { min = 2, max = 20 }
tokens_per_second = { min = 2000, max = 4000 }
"""


def setup(tmp_path: Path, pg_server: PgServer, body: str = STUDY
          ) -> tuple[Path, str, list[str]]:
    study = tmp_path / "study.toml"
    study.write_text(body, encoding="utf-8")
    url = pg_server.new_database()
    config = load_study(study)
    database = init_db(url, config, body)
    keys = [enroll(database, config, f"p{i:02d}")[1] for i in range(N_PARTICIPANTS)]
    database.dispose()
    return study, url, keys


def recorded(url: str) -> dict[str, tuple[str, str]]:
    database = open_db(url)
    with database.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, recorded_by, status FROM cycles")).all()
    database.dispose()
    return {r[0]: (r[1], r[2]) for r in rows}


def test_two_proxies_one_database_no_conflicts_no_loss(tmp_path: Path,
                                                       pg_server: PgServer) -> None:
    study, url, keys = setup(tmp_path, pg_server)
    (pa, a), (pb, b) = start(study, url, "site-a"), start(study, url, "site-b")
    clients = Clients(keys, [a, b])
    threads = clients.go()
    deadline = time.monotonic() + 30
    while len(clients.complete) < 150 and time.monotonic() < deadline:
        time.sleep(0.1)
    clients.stop.set()
    for t in threads:
        t.join(20)
    for p in (pa, pb):
        p.send_signal(signal.SIGTERM)
    for p in (pa, pb):
        assert p.wait(30) == 0, p.stderr.read() if p.stderr else ""
    rows = recorded(url)
    assert len(clients.complete) >= 100
    assert set(clients.complete) <= set(rows)  # every complete stream is recorded...
    assert len(rows) == len(set(clients.started))  # ...and nothing else, each exactly once
    assert {by for by, _ in rows.values()} == {"site-a", "site-b"}
    assert {st for _, st in rows.values()} == {"ok"}


def test_kill_9_of_one_proxy_loses_nothing_the_other_keeps_serving(
        tmp_path: Path, pg_server: PgServer) -> None:
    study, url, keys = setup(tmp_path, pg_server)
    (pa, a), (pb, b) = start(study, url, "site-a"), start(study, url, "site-b")
    clients = Clients(keys, [a, b])
    threads = clients.go()
    deadline = time.monotonic() + 30
    while len(clients.complete) < 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pa.pid, signal.SIGKILL)  # mid-traffic: streams are open on it right now
    pa.wait(10)
    n_at_kill = len(clients.complete)
    while len(clients.complete) < n_at_kill + 60 and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    clients.stop.set()
    for t in threads:
        t.join(20)
    pb.send_signal(signal.SIGTERM)
    assert pb.wait(30) == 0
    rows = recorded(url)
    assert len(clients.complete) >= n_at_kill + 60  # site-b carried on alone
    missing = set(clients.complete) - set(rows)
    assert not missing, f"{len(missing)} streams a client saw complete are not recorded"
    assert any(by == "site-b" and st == "ok" for by, st in rows.values())


def test_two_proxies_never_repeat_a_per_prompt_draw(tmp_path: Path, pg_server: PgServer
                                                    ) -> None:
    """A load balancer without sticky sessions: each participant's prompts alternate between
    two proxies, which claim blocks of request indices from the database, so no index (and
    no draw) repeats, and every recorded draw is the one its index seeds."""
    from flowtrial.study.randomization import per_prompt_draw

    study, url, keys = setup(tmp_path, pg_server, PER_PROMPT)
    config = load_study(study)
    (pa, a), (pb, b) = start(study, url, "site-a"), start(study, url, "site-b")
    n = 2 * INDEX_BLOCK + 3  # both proxies claim more than one block per participant

    def participant(key: str) -> None:
        with httpx.Client(timeout=15) as http:
            for j in range(n):
                r = http.post((a, b)[j % 2] + "/v1/chat/completions", headers={
                    "authorization": f"Bearer {key}"}, json={
                    "model": "flowtrial-sim-1", "max_tokens": 5,
                    "messages": [{"role": "user", "content": f"prompt {j}"}]})
                assert r.status_code == 200, r.text

    try:
        threads = [threading.Thread(target=participant, args=(k,)) for k in keys[:4]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for p in (pa, pb):
            p.send_signal(signal.SIGTERM)
        for p in (pa, pb):
            assert p.wait(30) == 0, p.stderr.read() if p.stderr else ""
    database = open_db(url)
    with database.engine.connect() as conn:
        rows = conn.execute(text("SELECT participant_id, recorded_by, draw_json, "
                                 "target_ttft_ms FROM cycles")).all()
    database.dispose()
    assert len(rows) == 4 * n and {r[1] for r in rows} == {"site-a", "site-b"}
    for pid in {r[0] for r in rows}:
        draws = [json.loads(r[2]) for r in rows if r[0] == pid]
        indices = [d["request_index"] for d in draws]
        assert len(set(indices)) == len(indices) == n, sorted(indices)
        for d in draws:
            assert d == per_prompt_draw(config.per_prompt, 11, pid, d["request_index"])
