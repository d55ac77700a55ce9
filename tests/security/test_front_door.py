"""Issue 19's attacks, re-run against a real proxy on a free loopback port: each one is
refused within its limit, and afterwards (or meanwhile) another participant's stream is still
within its shaping target and every answer the proxy completed is recorded.

Sizes stay small (a few MiB at most): the limits are what is tested, not the machine."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.frontdoor_helpers import (
    MODEL,
    assert_all_answers_recorded,
    assert_served_within_target,
    health,
    normal_stream,
    proxy,
    raw,
    read_response,
    send_until_answered,
    status_of,
    still_serving,
    study,
)

pytestmark = pytest.mark.timing

MiB = 1024 * 1024


# ---------------------------------------------------------------- 1. huge headers

def test_huge_header_is_refused_431_at_once_while_others_stream(tmp_path: Path) -> None:
    s = study(tmp_path)
    answered: list[str] = []
    with proxy(s) as px:
        result: dict[str, Any] = {}

        def attack() -> None:
            c = raw(px)
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + s.keys["mallory"].encode() + b"\r\nX-Big: ")
            t0 = time.monotonic()
            result["answer"], result["sent"] = send_until_answered(c, head, b"a" * 16384,
                                                                   8 * MiB)
            result["took"] = time.monotonic() - t0
            c.close()

        attacker = threading.Thread(target=attack)
        attacker.start()
        cid = normal_stream(px, s.keys["alice"])  # while the header is arriving
        answered.append(cid)
        attacker.join(30)
        assert status_of(result["answer"]) == 431
        assert b"proxy.max_header_bytes" in result["answer"]
        # Answered once the limit was passed, not after the whole 8 MiB (what was sent meanwhile
        # is in loopback socket buffers, a few MiB, and the lingering close's 1 MiB drop).
        assert result["sent"] < 8 * MiB and result["took"] < 10, result
        assert_served_within_target(s, cid)
        assert health(px)["front_door"]["headers_too_large"] == 1
        still_serving(px, s, answered)


def test_anthropic_path_gets_anthropic_shaped_431(tmp_path: Path) -> None:
    s = study(tmp_path)
    with proxy(s) as px:
        c = raw(px)
        answer, _ = send_until_answered(c, b"POST /v1/messages HTTP/1.1\r\nX-Big: ",
                                        b"b" * 8192, MiB)
        c.close()
        assert status_of(answer) == 431
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["type"] == "error" and "max_header_bytes" in body["error"]["message"]


@pytest.mark.parametrize(("request_bytes", "shape"), [
    (b"GARBAGE\x01 / HTTP/1.1\r\nHost: x\r\n\r\n", "openai"),  # a broken request line
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", "openai"),
    (b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nhello\r\n0\r\n\r\n", "anthropic"),  # a chunk size that is no number
    (b"POST /p/ft_x/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
     b"Content-Length: 2\r\n\r\nab", "anthropic"),  # two lengths: refused, not guessed
])
def test_malformed_framing_gets_the_protocols_error_shape(tmp_path: Path, request_bytes: bytes,
                                                          shape: str) -> None:
    """uvicorn would answer plain text; the proxy answers JSON in the protocol's error shape
    (OpenAI's, Anthropic's on the Messages paths), closes, and counts it."""
    s = study(tmp_path)
    with proxy(s) as px:
        c = raw(px)
        c.sendall(request_bytes)
        answer = read_response(c)
        c.close()
        assert status_of(answer) == 400, answer[:300]
        head, _, raw_body = answer.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower()
        body = json.loads(raw_body)
        if shape == "anthropic":
            assert body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
            message = body["error"]["message"]
        else:
            assert body["error"]["code"] == "invalid_http_request"
            message = body["error"]["message"]
        assert "not valid HTTP/1.1" in message
        assert health(px)["front_door"]["malformed"] == 1
        still_serving(px, s, [])


def test_large_legal_headers_trickled_are_parsed_once_and_served(tmp_path: Path) -> None:
    """60 KiB of headers in 600 small writes (under the 64 KiB limit) is a valid request: it
    is answered, and quickly (the head is handed to the parser whole, not 600 times)."""
    s = study(tmp_path)
    with proxy(s) as px:
        c = raw(px)
        c.sendall(b"GET /flowtrial/v1/health HTTP/1.1\r\nHost: x\r\nX-Long: ")
        t0 = time.monotonic()
        for _ in range(600):
            c.sendall(b"c" * 100)
        c.sendall(b"\r\nConnection: close\r\n\r\n")
        answer = read_response(c)
        took = time.monotonic() - t0
        c.close()
        assert status_of(answer) == 200, answer[:200]
        assert took < 10, took


def test_header_limit_is_a_setting(tmp_path: Path) -> None:
    s = study(tmp_path, {"max_header_bytes": 4096})
    with proxy(s) as px:
        c = raw(px)
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"d" * 5000 + b"\r\n\r\n")
        assert status_of(read_response(c)) == 431
        c.close()
        c = raw(px)
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"d" * 3000 + b"\r\n\r\n")
        assert status_of(read_response(c, 3)) == 200
        c.close()


# ---------------------------------------------------------------- 2. slow and idle connections

def test_silent_slow_and_surplus_connections_are_bounded(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    s = study(tmp_path, {"header_timeout_s": 1.0, "body_timeout_s": 1.0,
                         "idle_timeout_s": 1.0, "max_connections": 30})
    answered: list[str] = []
    caplog.set_level(logging.WARNING, logger="flowtrial.proxy")
    with proxy(s) as px:
        silent = [raw(px) for _ in range(40)]  # 30 allowed, 10 beyond the limit
        time.sleep(0.3)
        statuses = []
        for c in silent:
            c.settimeout(3.0)
            try:
                statuses.append(status_of(c.recv(200)))
            except TimeoutError:
                statuses.append(None)
        # The 10 surplus ones got 503 at once; the others 408 after the header timeout.
        assert statuses.count(503) >= 10 and statuses.count(408) >= 20, statuses
        assert set(statuses) <= {503, 408}, statuses
        assert any("proxy.max_connections" in r.getMessage() for r in caplog.records)
        for c in silent:
            c.close()

        slowloris = raw(px)
        slowloris.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        slow_body = raw(px)
        slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                          b"Bearer " + s.keys["mallory"].encode()
                          + b"\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        t0 = time.monotonic()
        a1, a2 = read_response(slowloris), read_response(slow_body)
        assert status_of(a1) == 408 and b"header_timeout_s" in a1
        assert status_of(a2) == 408 and b"body_timeout_s" in a2
        assert time.monotonic() - t0 < 8

        idle = raw(px)  # an idle keep-alive connection is closed after idle_timeout_s
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = idle.recv(4096)
        assert status_of(first) == 200
        t1 = time.monotonic()
        assert read_response(idle, 10) == b"" and time.monotonic() - t1 < 8
        stats = health(px)["front_door"]
        assert stats["connections_refused"] >= 10 and stats["body_timeouts"] == 1
        assert stats["header_timeouts"] >= 21
        still_serving(px, s, answered)
    # The slow body's request was never a cycle: nothing recorded for it.
    assert_all_answers_recorded(s, answered)


def test_answered_connections_give_way_to_new_ones(tmp_path: Path) -> None:
    """A half-open flood of 80 connections against max_connections = 30: the preauth cap
    answers 76 of them 408, and while those linger (1 s) they give way, so no connection of
    the flood's is refused 503 and Alice, right after it, is served at once (no retries; in
    CI a 1,100-connection flood once got her 503s for as long as its 408s lingered)."""
    s = study(tmp_path, {"max_connections": 30, "max_preauth_per_client": 4,
                         "header_timeout_s": 30.0})
    answered: list[str] = []
    with proxy(s) as px:
        flood = []
        for _ in range(80):
            c = raw(px)
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            flood.append(c)
        answered.append(normal_stream(px, s.keys["alice"]))  # within the flood's linger
        statuses = []
        for c in flood[:76]:
            c.settimeout(3.0)
            try:
                statuses.append(status_of(c.recv(200)))
            except (TimeoutError, ConnectionError) as exc:
                statuses.append(type(exc).__name__)
        assert set(statuses) == {408}, {x: statuses.count(x) for x in set(statuses)}
        front = health(px)["front_door"]
        assert front["connections_refused"] == 0 and front["preauth_evicted"] >= 76, front
        for c in flood:
            c.close()
    assert_served_within_target(s, answered[0])
    assert_all_answers_recorded(s, answered)


# ---------------------------------------------------------------- 3. text that cannot be stored

@pytest.mark.both_backends
def test_lone_surrogates_are_stored_replaced_and_flagged(tmp_path: Path,
                                                         new_db: Any) -> None:
    s = study(tmp_path, extra={"capture": {"content": "full"}}, where=new_db("study.db"))
    answered: list[str] = []
    body = (b'{"model": "x\\udfff", "stream": true, "max_tokens": 8, "messages": '
            b'[{"role": "user", "content": "hi \\ud800 there\\u0000"}]}')
    with proxy(s) as px:
        r = httpx.post(px.base_url + "/v1/chat/completions", content=body, timeout=30,
                       headers={"authorization": f"Bearer {s.keys['mallory']}",
                                "content-type": "application/json"})
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
        cid = r.headers["x-flowtrial-cycle-id"]
        answered.append(cid)
        model, prompt, error, status, fp = s.rows(
            "SELECT model, prompt_text, error, status, prompt_fingerprint FROM cycles "
            "WHERE id = :id", {"id": cid})[0]
        assert model == "x\ufffd" and status == "ok" and fp
        assert "\ufffd there\ufffd" in prompt
        assert error.startswith("text_replaced:") and "model" in error and "prompt" in error
        assert health(px)["status"] == "ok"
        still_serving(px, s, answered)


def test_a_row_that_fails_to_build_is_held_retried_and_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the first row build raises (a bug). The client is not told the answer
    ended, the row is held and written on retry, the failure is counted and health says
    degraded."""
    from flowtrial.instrumentation.proxy.recorder import CycleRecord

    real_row = CycleRecord.row
    calls = {"n": 0}

    def flaky_row(self: CycleRecord, capture: str) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug while building the row")
        return real_row(self, capture)

    monkeypatch.setattr(CycleRecord, "row", flaky_row)
    s = study(tmp_path)
    with proxy(s) as px:
        r = httpx.post(px.base_url + "/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "stream": True, "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]},
                       headers={"authorization": f"Bearer {s.keys['mallory']}"})
        assert "[DONE]" not in r.text and "recording_failed" in r.text
        cid = r.headers["x-flowtrial-cycle-id"]
        deadline = time.monotonic() + 10
        while not s.rows("SELECT 1 FROM cycles WHERE id = :id", {"id": cid}):
            assert time.monotonic() < deadline, "the held row was never written"
            time.sleep(0.05)
        status, error = s.rows("SELECT status, error FROM cycles WHERE id = :id",
                               {"id": cid})[0]
        assert status == "error" and "could not be written at first" in error
        h = health(px)
        assert h["status"] == "degraded" and h["database"]["row_errors"] == 1
        assert h["record_failures"] == 1 and h["database"]["recovered_cycles"] == 1
        still_serving(px, s, [cid])


def test_proxy_error_says_recorded_only_when_it_is(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the exchange fails before answering; then also the record."""
    from flowtrial.instrumentation.proxy.recorder import Recorder
    from flowtrial.instrumentation.proxy.relay import Exchange

    async def broken(self: Exchange, reply: Any) -> None:
        raise RuntimeError("a bug in the relay")

    monkeypatch.setattr(Exchange, "_relay_stream", broken)
    s = study(tmp_path)
    req = {"model": MODEL, "stream": True, "max_tokens": 4,
           "messages": [{"role": "user", "content": "hi"}]}
    auth = {"authorization": f"Bearer {s.keys['mallory']}"}
    with proxy(s) as px:
        r = httpx.post(px.base_url + "/v1/chat/completions", json=req, headers=auth, timeout=30)
        assert r.status_code == 500 and "(recorded)" in r.json()["error"]["message"]
        assert s.rows("SELECT status FROM cycles")[0][0] == "error"

        async def refuse(self: Recorder, rec: Any) -> None:
            raise RuntimeError("cannot record")

        monkeypatch.setattr(Recorder, "record", refuse)
        r = httpx.post(px.base_url + "/v1/chat/completions", json=req, headers=auth, timeout=30)
        assert r.status_code == 500 and "recorded" not in r.json()["error"]["message"]


@pytest.mark.parametrize(("payload", "status", "param"), [
    ('{"events": [{"kind": "custom", "payload": {"note": "a\\udfffb"}}]}', 400,
     "events[0].payload.note"),
    ('{"events": [{"kind": "custom", "payload": {"score": NaN}}]}', 422,
     "events[0].payload.score"),
    ('{"events": [{"kind": "custom", "payload": {"n": [1, 1e999]}}]}', 422,
     "events[0].payload.n[1]"),
])
def test_event_payloads_that_cannot_be_stored_are_refused_naming_the_field(
        tmp_path: Path, payload: str, status: int, param: str) -> None:
    s = study(tmp_path)
    with proxy(s) as px:
        r = httpx.post(px.base_url + "/flowtrial/v1/events", content=payload.encode(),
                       headers={"authorization": f"Bearer {s.keys['mallory']}"}, timeout=10)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]
        r = httpx.post(px.base_url + "/flowtrial/v1/continue", content=payload.encode(),
                       headers={"authorization": f"Bearer {s.keys['mallory']}"}, timeout=10)
        assert r.status_code == status and param.split(".", 1)[0] in r.text
    assert s.rows("SELECT COUNT(*) FROM events")[0][0] == 0


# ---------------------------------------------------------------- 4. Expect: 100-continue

def test_expect_100_continue_is_answered_and_never_relayed_as_final(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """curl's way of posting a large body, to a proxy whose upstream is the simulated model
    served over real HTTP (which itself answers 100 Continue when asked)."""
    from flowtrial.instrumentation.mock_model.app import create_mock_app
    from flowtrial.instrumentation.mock_model.model import MockModel
    from tests.instrumentation.servers import run_asgi_server

    monkeypatch.setenv("FLOWTRIAL_TEST_KEY", "sk-unused-by-the-simulated-model")
    with run_asgi_server(create_mock_app(MockModel(tokens_per_second=1e6, ttft_ms=0))) as up:
        s = study(tmp_path, extra={"upstream": {"kind": "openai", "base_url": up + "/v1",
                                                "api_key_env": "FLOWTRIAL_TEST_KEY"}})
        answered: list[str] = []
        with proxy(s) as px:
            body = json.dumps({"model": MODEL, "max_tokens": 8, "stream": True, "messages": [
                {"role": "user", "content": "x" * 200_000}]}).encode()
            c = raw(px)
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      + s.keys["mallory"].encode() + b"\r\nContent-Type: application/json\r\n"
                      + b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\nConnection: close\r\n\r\n")
            c.settimeout(10)
            interim = c.recv(4096)
            assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
            c.sendall(body)
            answer = read_response(c, 30)
            c.close()
            assert status_of(answer) == 200, answer[:300]
            assert b"data: [DONE]" in answer
            cid = answer.split(b"x-flowtrial-cycle-id: ", 1)[1].split(b"\r\n", 1)[0].decode()
            answered.append(cid)
            still_serving(px, s, answered)


# ---------------------------------------------------------------- 5. WebSocket inbox

def test_websocket_messages_queued_past_the_inbox_close_1008(tmp_path: Path) -> None:
    import asyncio

    import websockets
    from websockets.asyncio.client import connect

    s = study(tmp_path, {"max_body_bytes": MiB, "ws_inbox_bytes": 2 * MiB})
    with proxy(s) as px:
        url = px.base_url.replace("http://", "ws://") + "/v1/responses"
        auth = {"Authorization": f"Bearer {s.keys['mallory']}"}
        filler = json.dumps({"type": "response.create", "model": MODEL, "input": "y" * 900_000})

        async def flood() -> int | None:
            async with connect(url, additional_headers=auth, max_size=None) as ws:
                await ws.send(json.dumps({"type": "response.create", "model": MODEL,
                                          "input": "hi", "max_output_tokens": 2000}))
                try:
                    for _ in range(8):  # 7.2 MB against a 2 MiB inbox, during the turn
                        await ws.send(filler)
                    await asyncio.wait_for(ws.recv(), 10)
                    async for _ in ws:
                        pass
                except websockets.ConnectionClosed as exc:
                    return exc.rcvd.code if exc.rcvd else None
                return ws.close_code

        async def too_big() -> int | None:
            async with connect(url, additional_headers=auth, max_size=None) as ws:
                try:
                    await ws.send("z" * (2 * MiB))  # over max_body_bytes + 64 KiB: 1009
                    await asyncio.wait_for(ws.recv(), 10)
                except websockets.ConnectionClosed as exc:
                    return exc.rcvd.code if exc.rcvd else None
                return ws.close_code

        assert asyncio.run(flood()) == 1008
        assert asyncio.run(too_big()) == 1009
        # The turn that was running is recorded (abandoned); nothing else is.
        deadline = time.monotonic() + 10
        while not (rows := s.rows("SELECT id, status FROM cycles")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [r[1] for r in rows] == ["abandoned"]
        still_serving(px, s, [rows[0][0]])


# ---------------------------------------------------------------- 7. forms cut short

def test_client_gone_mid_form_is_a_quiet_400(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    from flowtrial.instrumentation.participant_page import PREFIX

    s = study(tmp_path, {"body_timeout_s": 1.0})
    caplog.set_level(logging.DEBUG)
    with proxy(s) as px:
        for path in (f"{PREFIX}/login", "/v1/chat/completions", "/flowtrial/v1/events"):
            c = raw(px)
            c.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ".encode()
                      + s.keys["mallory"].encode() + b"\r\nContent-Type: application/"
                      b"x-www-form-urlencoded\r\nContent-Length: 500\r\n\r\nkey=ft_")
            time.sleep(0.2)
            c.close()  # gone mid-body
        c = raw(px)  # and one cut off by the body timeout
        c.sendall(f"POST {PREFIX}/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/"
                  "x-www-form-urlencoded\r\nContent-Length: 500\r\n\r\nkey=".encode())
        assert status_of(read_response(c)) == 408
        c.close()
        time.sleep(0.5)
        still_serving(px, s, [])
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]


# ---------------------------------------------------------------- 2b. the file-descriptor limit

def test_idle_flood_under_a_small_open_file_limit(tmp_path: Path) -> None:
    """Issue 19's run: `ulimit -n` small, more idle connections than it allows. The proxy
    (its own process, under that limit) takes what fits, refuses the rest with 503 and logs
    it; once the silent ones time out, 65 new clients are all served and recorded."""
    import os
    import resource
    import subprocess
    import sys

    from tests.instrumentation.test_proxy_process import ROOT, setup_study

    text = ('[study]\nname = "fd-test"\ndesign = "parallel"\n[upstream.mock]\n'
            'tokens_per_second = 100000\nttft_ms = 0\n[[arms]]\nname = "paced"\nttft_ms = 50\n'
            'tokens_per_second = 400\n[proxy]\nheader_timeout_s = 2\n'
            # The preauth caps above the file limit: it binds, not their evictions.
            'max_preauth_per_client = 1000\nmax_preauth_connections = 1000\n')
    study_file, db, key = setup_study(tmp_path, text)
    limit = 300  # the proxy can hold (300 - 64) // 2 = 118 connections under it

    def small_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial.cli", "proxy", "--study", str(study_file),
         "--db", str(db), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        preexec_fn=small_fd_limit)
    try:
        assert proc.stdout is not None
        url = ""
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("OPENAI_BASE_URL="):
                url = line.strip().split("=", 1)[1].removesuffix("/v1")
            assert line or proc.poll() is None, "the proxy did not start"
        port = int(url.rsplit(":", 1)[1])
        idle = []
        for _ in range(400):
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            idle.append(c)
        answers = []
        for c in idle:
            c.settimeout(10)
            try:
                answers.append(status_of(c.recv(100)))
            except (TimeoutError, ConnectionError) as exc:
                answers.append(type(exc).__name__)
        # Each got an answer: 503 at the door, or 408 once its header time was up (those
        # the kernel queued while the proxy was out of file descriptors come in later).
        assert set(answers) <= {503, 408}, {a: answers.count(a) for a in set(answers)}
        assert answers.count(503) >= 100 and answers.count(408) <= 118 + 100, answers
        for c in idle:
            c.close()
        time.sleep(2.5)  # the silent ones have had their 408 by now

        def one(i: int) -> str | None:
            r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "stream": True, "max_tokens": 10,
                "messages": [{"role": "user", "content": f"question {i}"}]},
                headers={"authorization": f"Bearer {key}"})
            ok = r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
            return r.headers["x-flowtrial-cycle-id"] if ok else None

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(one, range(65)))
        assert all(ids), f"{ids.count(None)} of 65 clients failed"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "ulimit -n" in err and "at most 118 connections" in err, err[-2000:]
    assert "refused" in err and "503" in err, err[-2000:]
    import sqlite3

    with sqlite3.connect(db) as conn:
        recorded = {r[0] for r in conn.execute("SELECT id FROM cycles")}
    assert set(ids) <= recorded and len(recorded) == 65
