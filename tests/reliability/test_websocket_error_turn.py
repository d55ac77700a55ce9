"""A Responses WebSocket turn that the upstream ends with an ``error`` event is recorded
before the client sees that event, like every other final event ("nothing the client saw
complete is lost"); if the record cannot be made, the client gets the ``recording_failed``
error instead.

The upstream is the real misbehaving server of :mod:`tests.reliability.faulty_upstream`
(``x_fault: echo_key:N``: N events, then an ``error`` with status 500). The commit is made
slow for real: another connection holds SQLite's write lock for a moment, so the writer waits
for it; the database is queried the moment the client has the error event, without waiting.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import serve_proxy
from tests.instrumentation.conftest import StudySetup
from tests.reliability.faulty_upstream import FaultyUpstream, faulty_upstream

pytestmark = pytest.mark.usefixtures("fine_gil_switching")

KEY_VAR = "FT_WS_ERROR_UPSTREAM_KEY"
LOCK_S = 0.5


@pytest.fixture
def served(make_study: Any, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[StudySetup, Any, FaultyUpstream]]:
    monkeypatch.setenv(KEY_VAR, "sk-ws-error-turn-key")
    with faulty_upstream() as up:
        s = make_study({"upstream": {"kind": "openai", "timeout_s": 5, "openai": {
            "base_url": up.base_url + "/v1", "api_key_env": KEY_VAR}}})
        with serve_proxy(s.db, s.config, grace_s=3) as px:
            yield s, px, up


def hold_write_lock(path: Any, seconds: float) -> threading.Event:
    """Take SQLite's write lock from another connection, release it after ``seconds``;
    the returned event is set once the lock is held."""
    held = threading.Event()

    def run() -> None:
        con = sqlite3.connect(path, timeout=5, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    threading.Thread(target=run, daemon=True).start()
    assert held.wait(5)
    return held


async def error_turn(url: str, key: str, rows: Any) -> tuple[dict[str, Any], list[Any]]:
    """One turn the upstream ends with an error: (the last event, the cycle rows read the
    moment it arrived)."""
    async with connect(url.replace("http", "ws") + "/v1/responses",
                       additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "m", "input": "x",
                                  "max_output_tokens": 20, "x_fault": "echo_key:2"}))
        while True:
            ev = json.loads(await asyncio.wait_for(ws.recv(), 20))
            if ev["type"] in ("error", "response.completed", "response.incomplete"):
                return ev, rows()  # no waiting: what is durable right now


def test_error_event_is_sent_only_once_its_cycle_is_durable(served: Any) -> None:
    s, px, _ = served

    def rows() -> list[Any]:
        return s.rows("SELECT status, http_status, transport, error FROM cycles")

    hold_write_lock(s.db, LOCK_S)
    t0 = time.monotonic()
    ev, seen = asyncio.run(error_turn(px.base_url, s.key, rows))
    assert ev["type"] == "error" and ev["status"] == 500, ev
    assert len(seen) == 1, "the client had the error event before its cycle was recorded"
    status, http_status, transport, error = seen[0]
    assert (status, http_status, transport) == ("upstream_error", 101, "websocket")
    assert time.monotonic() - t0 >= LOCK_S * 0.8  # it did wait for the commit
    assert error == ev["error"]["message"]
    assert error.startswith("Incorrect API key provided: [redacted]")  # the key is not


def test_error_turn_that_cannot_be_recorded_gets_recording_failed(served: Any) -> None:
    """The write lock outlasts the writer's (shortened) busy timeout: the turn's row cannot
    be made durable, so the client gets the ``recording_failed`` error, not the upstream's;
    the row is written once the database is back."""
    s, px, _ = served

    def short_busy(dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
        dbapi_conn.execute("PRAGMA busy_timeout = 100")

    event.listen(px.writer.engine, "checkout", short_busy)  # each commit checks one out
    hold_write_lock(s.db, 1.0)
    ev, _ = asyncio.run(error_turn(px.base_url, s.key, lambda: []))
    assert ev["type"] == "error" and ev["error"]["code"] == "recording_failed", ev
    assert "Incorrect API key" not in json.dumps(ev)
    deadline = time.monotonic() + 15
    while httpx.get(px.base_url + "/flowtrial/v1/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the proxy did not recover"
        time.sleep(0.05)
    deadline = time.monotonic() + 5
    while not (got := s.rows("SELECT status, error FROM cycles")):
        assert time.monotonic() < deadline, "the held row was never written"
        time.sleep(0.05)
    assert got[0][0] == "upstream_error" and "written late" in got[0][1]
