"""The study database fails under a running proxy: disk full, locked, or (PostgreSQL) the
server stopped. The proxy must not serve traffic it cannot record: streams in flight lose
their final event (the client gets the protocol's error, never a silent success) and their
rows are kept and written once the database is back; new requests get 503 + Retry-After in
their protocol's shape (the WebSocket mode an ``error`` event), the health endpoint 503; when
the database works again the proxy recovers by itself.

The failures are real: SQLite's ``max_page_count`` on the writer's connection makes the
next page allocation fail with SQLITE_FULL ("database or disk is full"), exactly as a full
disk does; another connection holding ``BEGIN EXCLUSIVE`` past the writer's busy timeout is a
locked database; the PostgreSQL server is stopped with ``pg_ctl stop``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import websockets
from sqlalchemy import event
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.proxy.health import DatabaseGate
from flowtrial.study.schema import Cycle
from flowtrial.study.storage import WriteBatch
from tests.instrumentation.conftest import StudySetup, build_study

pytestmark = pytest.mark.usefixtures("fine_gil_switching")

BIG = "def f(x):\n    return x\n" * 400  # ~9 KB: with full capture every row needs new pages
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


class WriterKnobs:
    """Settings applied to the record writer's connection at every checkout (the writer
    thread checks one out per commit): ``full`` caps the file at its current size,
    ``busy_ms`` replaces the 10 s busy timeout (so a lock test takes a moment, not 10 s)."""

    def __init__(self, engine: Any) -> None:
        self.full = False
        self.busy_ms: int | None = None
        event.listen(engine, "checkout", self._apply)

    def _apply(self, dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA max_page_count = {1 if self.full else 1073741823}")
        if self.busy_ms is not None:
            cur.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
        cur.close()


def study(make_study: Callable[..., StudySetup], ttft_ms: float = 300) -> StudySetup:
    return make_study({"capture": {"content": "full"},
                       "upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}},
                       "arms": [{"name": "a", "ttft_ms": ttft_ms, "tokens_per_second": 2000}]})


def health(url: str) -> httpx.Response:
    return httpx.get(url + "/flowtrial/v1/health", timeout=10)


def wait_healthy(url: str, timeout: float = 10.0) -> float:
    """Seconds until the health endpoint answers 200 again."""
    t0 = time.monotonic()
    while health(url).status_code != 200:
        assert time.monotonic() - t0 < timeout, health(url).json()
        time.sleep(0.05)
    return time.monotonic() - t0


def stream_in_flight(url: str, key: str, out: list[dict[str, Any]]) -> threading.Thread:
    """A streaming chat request in a thread (openai SDK); appends what the client saw."""

    def run() -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        got: dict[str, Any] = {"text": "", "error": None, "finished": False}
        try:
            raw = c.chat.completions.with_raw_response.create(
                model="m", stream=True, max_tokens=30,
                messages=[{"role": "user", "content": BIG + "\nexplain this"}])
            got["cid"] = raw.headers["x-flowtrial-cycle-id"]
            for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    got["text"] += chunk.choices[0].delta.content
            got["finished"] = True  # the SDK saw [DONE]
        except openai.APIError as exc:
            got["error"] = exc
        out.append(got)

    t = threading.Thread(target=run)
    t.start()
    return t


def assert_refused_everywhere(url: str, key: str) -> None:
    """Every way of asking for an answer gets 503 + Retry-After in its protocol's shape."""
    oai = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    calls = {
        "chat": lambda: oai.chat.completions.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]),
        "completions": lambda: oai.completions.create(model="m", prompt="x", max_tokens=5),
        "responses": lambda: oai.responses.create(model="m", input="x", stream=True),
    }
    for name, call in calls.items():
        with pytest.raises(openai.InternalServerError) as exc:
            call()
        assert exc.value.status_code == 503, name
        assert exc.value.response.headers["retry-after"] == "1"
        assert exc.value.response.json()["error"]["code"] == "database_unavailable"
        assert "refuses them rather than serve them unrecorded" in str(exc.value)
    ant = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as aexc:
        ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert aexc.value.status_code == 503
    assert aexc.value.response.headers["retry-after"] == "1"
    assert aexc.value.response.json()["type"] == "error"
    assert aexc.value.response.json()["error"]["type"] == "api_error"
    r = httpx.post(url + "/flowtrial/v1/events", headers={"authorization": f"Bearer {key}"},
                   json={"events": [{"kind": "custom"}]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    h = health(url)
    assert h.status_code == 503 and h.headers["retry-after"] == "1"
    assert h.json()["status"] == "unavailable" and not h.json()["database"]["ok"]


async def ws_turns(url: str, key: str, opened: threading.Event, down: threading.Event,
                   recover: Callable[[], None]) -> list[dict[str, Any]]:
    """On one socket opened while the database is up: once ``down`` is set, a turn (an error
    event), ``recover()``, a turn after (a complete answer). The two turns' last events."""
    last = []
    async with connect(url.replace("http", "ws") + "/v1/responses",
                       additional_headers={"authorization": f"Bearer {key}"}) as ws:
        opened.set()
        await asyncio.to_thread(down.wait, 30)
        for step in (0, 1):
            if step == 1:
                await asyncio.to_thread(recover)
            await ws.send(json.dumps({"type": "response.create", "model": "m", "input": "x",
                                      "max_output_tokens": 10}))
            while (ev := json.loads(await ws.recv()))["type"] not in TERMINAL:
                pass
            last.append(ev)
    return last


async def ws_handshake_refusal(url: str, key: str) -> tuple[int, str, str]:
    """A new socket's handshake refused: status, Retry-After and the error code."""
    with pytest.raises(websockets.InvalidStatus) as exc:
        async with connect(url.replace("http", "ws") + "/v1/responses",
                           additional_headers={"authorization": f"Bearer {key}"}):
            pass
    r = exc.value.response
    return r.status_code, r.headers.get("retry-after", ""), json.loads(r.body)["error"]["code"]


def test_disk_full_refuses_new_requests_holds_in_flight_cycles_and_recovers(make_study
                                                                            ) -> None:
    s = study(make_study)
    with serve_proxy(s.db, s.config, grace_s=5) as px:
        url = px.base_url
        knobs = WriterKnobs(px.writer.engine)
        oai = openai.OpenAI(base_url=url + "/v1", api_key=s.key, max_retries=0)
        oai.chat.completions.create(model="m", max_tokens=5,
                                    messages=[{"role": "user", "content": BIG}])

        # A Responses WebSocket opened while the database is up (its turns come below).
        def lift() -> None:
            knobs.full = False
            wait_healthy(url)

        opened, down = threading.Event(), threading.Event()
        ws_got: dict[str, list[dict[str, Any]]] = {}
        ws_thread = threading.Thread(target=lambda: ws_got.update(
            turns=asyncio.run(ws_turns(url, s.key, opened, down, lift))))
        ws_thread.start()
        assert opened.wait(20)
        # Three streams in flight (held by the 300 ms TTFT floor) when the disk fills up.
        seen: list[dict[str, Any]] = []
        threads = [stream_in_flight(url, s.key, seen) for _ in range(3)]
        time.sleep(0.1)
        knobs.full = True
        for t in threads:
            t.join(20)
        assert len(seen) == 3
        for got in seen:
            # The answer's text arrived, then an error instead of [DONE]: never a silent
            # success for a cycle that is not recorded.
            assert not got["finished"] and got["text"], got
            assert "could not record" in str(got["error"])
        assert_refused_everywhere(url, s.key)
        assert health(url).json()["database"]["held_cycles"] == 3
        assert "database or disk is full" in health(url).json()["database"]["error"]

        # A new WebSocket is refused at its handshake (the hooks' Recording, as every route);
        # the open one refuses a turn with an error event on a socket that stays open; the
        # database comes back; the same socket's next turn is answered.
        assert asyncio.run(ws_handshake_refusal(url, s.key)) == (503, "1",
                                                                 "database_unavailable")
        down.set()
        ws_thread.join(40)
        down, up = ws_got["turns"]
        assert down["type"] == "error" and down["status"] == 503
        assert down["error"]["code"] == "database_unavailable"
        assert up["type"] in ("response.completed", "response.incomplete")
        after = oai.chat.completions.create(model="m", max_tokens=5,
                                            messages=[{"role": "user", "content": "x"}])
        assert after.choices[0].message.content
        h = health(url).json()
        assert h["status"] == "ok" and h["database"]["held_cycles"] == 0
        assert h["database"]["recovered_cycles"] == 3 and h["database"]["trips"] == 1
    rows = {r.id: r for r in s.rows("SELECT id, status, http_status, error, content_text, "
                                    "transport FROM cycles")}
    for got in seen:
        row = rows[got["cid"]]  # written after the recovery, saying what the client got
        assert row.status == "error" and row.http_status == 200
        assert "client got an error instead of its end" in row.error
        assert row.content_text == got["text"]
    assert sorted((r.status, r.transport) for r in rows.values()) == sorted(
        [("ok", "http")] * 2 + [("error", "http")] * 3 + [("ok", "websocket")])


def test_sdk_retries_ride_out_a_short_outage(make_study) -> None:
    """Retry-After: 1 lets the SDKs' own retries succeed once the database is back."""
    s = study(make_study, ttft_ms=20)
    with serve_proxy(s.db, s.config, grace_s=5) as px:
        knobs = WriterKnobs(px.writer.engine)
        oai = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        knobs.full = True
        with pytest.raises(openai.InternalServerError):  # trips the gate
            oai.chat.completions.create(model="m", max_tokens=5,
                                        messages=[{"role": "user", "content": BIG}])
        threading.Timer(0.3, lambda: setattr(knobs, "full", False)).start()
        patient = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=4)
        t0 = time.monotonic()
        answer = patient.chat.completions.create(model="m", max_tokens=5,
                                                 messages=[{"role": "user", "content": "x"}])
        assert answer.choices[0].message.content and time.monotonic() - t0 < 10
        refused = health(px.base_url).json()["database"]["refused_requests"]
        assert refused >= 1  # it was refused first, then served


@contextmanager
def exclusive_lock(path: Any) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(path, timeout=5, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        yield con
    finally:
        con.execute("ROLLBACK")
        con.close()


def test_locked_database_refuses_then_recovers(make_study) -> None:
    """Another process holds the write lock past the writer's busy timeout: the answer that
    cannot be recorded is withheld (503), then everything is refused until the lock goes."""
    s = study(make_study, ttft_ms=20)
    with serve_proxy(s.db, s.config, grace_s=5) as px:
        knobs = WriterKnobs(px.writer.engine)
        knobs.busy_ms = 200
        oai = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        oai.chat.completions.create(model="m", max_tokens=5,
                                    messages=[{"role": "user", "content": "x"}])
        with exclusive_lock(s.db):
            raw = httpx.post(px.base_url + "/v1/chat/completions", timeout=20,
                             headers={"authorization": f"Bearer {s.key}"},
                             json={"model": "m", "max_tokens": 5,
                                   "messages": [{"role": "user", "content": "held"}]})
            assert raw.status_code == 503
            assert raw.json()["error"]["code"] == "recording_failed"
            assert_refused_everywhere(px.base_url, s.key)
            time.sleep(0.6)  # a probe or two fail meanwhile: still refused
            assert health(px.base_url).status_code == 503
            assert "locked" in health(px.base_url).json()["database"]["error"]
        wait_healthy(px.base_url)
        oai.chat.completions.create(model="m", max_tokens=5,
                                    messages=[{"role": "user", "content": "after"}])
    rows = s.rows("SELECT prompt_text, status, http_status, error FROM cycles "
                  "ORDER BY t_request_ns")
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("x", "ok", 200), ("held", "error", 503), ("after", "ok", 200)]
    assert "client got an error" in rows[1][3]


def test_postgresql_server_stopped_under_a_running_proxy(pg_server: Any, tmp_path: Path
                                                          ) -> None:
    """The PostgreSQL server goes away (``pg_ctl stop``) under a running proxy: 503s; it
    starts again: the proxy recovers by itself and records again, including the cycle that
    was in flight when the server stopped."""
    pg = pg_server
    setup = build_study(tmp_path, {
        "capture": {"content": "full"},
        "upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 1}},
        "arms": [{"name": "a", "ttft_ms": 300, "tokens_per_second": 2000}]},
        where=pg.new_database())
    try:
        with serve_proxy(setup.db, setup.config, grace_s=5) as px:
            oai = openai.OpenAI(base_url=px.base_url + "/v1", api_key=setup.key, max_retries=0)
            oai.chat.completions.create(model="m", max_tokens=5,
                                        messages=[{"role": "user", "content": "before"}])
            seen: list[dict[str, Any]] = []
            t = stream_in_flight(px.base_url, setup.key, seen)
            time.sleep(0.1)
            pg.stop("fast")
            try:
                t.join(20)
                assert not seen[0]["finished"] and "could not record" in str(seen[0]["error"])
                assert_refused_everywhere(px.base_url, setup.key)
            finally:
                pg.start()
            wait_healthy(px.base_url, timeout=15)
            oai.chat.completions.create(model="m", max_tokens=5,
                                        messages=[{"role": "user", "content": "after"}])
            assert health(px.base_url).json()["database"]["recovered_cycles"] == 1
        rows = setup.rows("SELECT id, status, error FROM cycles ORDER BY t_request_ns")
        assert [r[1] for r in rows] == ["ok", "error", "ok"]
        assert rows[1][0] == seen[0]["cid"] and "client got an error" in rows[1][2]
    finally:
        setup.database.dispose()


def test_held_rows_are_bounded() -> None:
    """Beyond ``max_held`` rows waiting for the database, the oldest are dropped (and
    counted): an outage cannot grow the proxy's memory without limit."""
    gate = DatabaseGate(writer=None, max_held=3)  # type: ignore[arg-type]
    for i in range(5):
        gate.hold(WriteBatch(Cycle, [{"id": f"c{i}"}]))
    assert gate.held == 3 and gate.dropped == 2
    assert [b.rows[0]["id"] for b in gate._held] == ["c2", "c3", "c4"]
