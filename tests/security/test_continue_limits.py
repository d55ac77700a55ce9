"""Continue's data endpoint against oversized and re-sent bodies, over real HTTP (uvicorn).

An oversized body is refused with 413 in the endpoint's error shape without being read: at
once when its ``Content-Length`` says so, and as soon as the limit is passed when it comes
chunked (no length). A middleware counts the body bytes the endpoint actually pulled. A
re-sent payload is answered as a duplicate, not as newly accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from flowtrial.instrumentation.continue_data import CONTINUE_PATH, continue_routes
from tests.capture.conftest import build
from tests.capture.test_continue_data import ANSWER, autocomplete
from tests.instrumentation.servers import run_asgi_server

# Capture writes and reads the study database: run on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

LIMIT = 4096
NS = 1_000_000_000


class BodyMeter:
    """ASGI middleware: how many request-body bytes the app read, per request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.read: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        i = len(self.read)
        self.read.append(0)

        async def counting() -> Any:
            msg = await receive()
            if msg["type"] == "http.request":
                self.read[i] += len(msg.get("body", b""))
            return msg

        await self.app(scope, counting, send)


@pytest.fixture
def served(tmp_path: Path, new_db: Callable[[str], str | Path]
           ) -> Iterator[tuple[Any, str, BodyMeter]]:
    study = build(tmp_path, {"proxy": {"max_body_bytes": LIMIT}},
                  where=new_db(f"{tmp_path}/study.db"))
    now = time.time_ns()
    study.add_cycle("c_1", "p01", now - 60 * NS, now - 58 * NS, content=ANSWER)
    meter = BodyMeter(Starlette(routes=continue_routes(study.database, study.config)))
    try:
        with run_asgi_server(meter) as url:
            yield study, url, meter
    finally:
        study.database.dispose()


def events(study: Any) -> int:
    return int(study.rows("SELECT count(*) FROM events")[0][0])


def assert_too_large(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and str(LIMIT) in err["message"]


def test_declared_length_over_the_limit_is_refused_unread(served: Any) -> None:
    study, url, meter = served
    body = b'{"name": "autocomplete", "data": {"completion": "' + b"x" * (4 * LIMIT) + b'"}}'
    r = httpx.post(url + CONTINUE_PATH, content=body, timeout=10, headers={
        "authorization": f"Bearer {study.keys['p01']}", "content-type": "application/json"})
    assert_too_large(r)
    assert meter.read[-1] == 0  # refused on its Content-Length, not a byte read
    assert events(study) == 0


def test_chunked_body_over_the_limit_is_refused_once_past_it(served: Any) -> None:
    study, url, meter = served
    sent = 0
    total = 1024 * LIMIT  # 4 MiB, in 1 KiB chunks, no Content-Length

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        yield b'{"name": "autocomplete", "data": {"completion": "'
        while sent < total:
            sent += 1024
            yield b"x" * 1024
        yield b'"}}'

    r = httpx.post(url + CONTINUE_PATH, content=chunks(), timeout=10, headers={
        "authorization": f"Bearer {study.keys['p01']}", "content-type": "application/json"})
    assert_too_large(r)
    assert "content-length" not in r.request.headers  # it did go chunked
    # Reading stopped once past the limit (one receive hands over what uvicorn buffered,
    # some 64-128 KiB), not after the whole body.
    assert LIMIT < meter.read[-1] < total // 8, meter.read
    assert events(study) == 0
    # A body within the limit still goes through on the same endpoint.
    ok = httpx.post(url + CONTINUE_PATH, json=autocomplete(True), timeout=10,
                    headers={"authorization": f"Bearer {study.keys['p01']}"})
    assert ok.status_code == 200 and ok.json()["accepted"] == 1


def test_resent_payload_is_answered_as_a_duplicate(served: Any) -> None:
    study, url, _ = served
    auth = {"authorization": f"Bearer {study.keys['p01']}"}
    first = httpx.post(url + CONTINUE_PATH, json=autocomplete(True), headers=auth, timeout=10)
    again = httpx.post(url + CONTINUE_PATH, json=autocomplete(True), headers=auth, timeout=10)
    assert first.status_code == again.status_code == 200
    assert first.json() == {"accepted": 1, "duplicates": 0, "kind": "accept",
                            "cycle_id": "c_1", "link": "text"}
    assert again.json() == {"accepted": 0, "duplicates": 1, "kind": "accept",
                            "cycle_id": "c_1", "link": "text"}
    assert events(study) == 1
    other = httpx.post(url + CONTINUE_PATH, json=autocomplete(False), headers=auth, timeout=10)
    assert other.json()["accepted"] == 1 and other.json()["duplicates"] == 0
    assert events(study) == 2
