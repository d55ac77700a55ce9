"""The Responses WebSocket mode through the real proxy (``ws://…/v1/responses``), with the
``websockets`` client: turns chained by ``previous_response_id`` as cycles, warm-ups, errors
that keep the socket usable, 401 at the handshake, disconnects, and a real upstream over
WebSocket (the simulated model served by uvicorn)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import create_proxy_app, serve_proxy
from tests.instrumentation.proxy_servers import closed_port, on_time
from tests.instrumentation.servers import run_asgi_server

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
MODEL = "flowtrial-sim-1"
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
DONE = {"response.completed", "response.incomplete"}  # incomplete: max_output_tokens hit


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/responses"


def create(prompt: str, previous: str | None = None, **extra: Any) -> str:
    msg = {"type": "response.create", "model": MODEL, "input": prompt, **extra}
    if previous:
        msg["previous_response_id"] = previous
    return json.dumps(msg)


async def turn(ws: Any, message: str) -> tuple[list[dict[str, Any]], float]:
    """Send one message; the events up to the turn's last one, and the time to the first
    text delta (s)."""
    t0 = time.monotonic()
    await ws.send(message)
    events, first = [], float("nan")
    while True:
        ev = json.loads(await ws.recv())
        if ev["type"] == "response.output_text.delta" and first != first:
            first = time.monotonic() - t0
        events.append(ev)
        if ev["type"] in TERMINAL:
            return events, first


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    s = make_study_module({"upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                           "capture": {"content": "full"},
                           "arms": [{"name": "a", "ttft_ms": 120, "tokens_per_second": 800}]})
    with serve_proxy(s.db, s.config) as px:
        yield s, px


def test_two_turns_with_previous_response_id_are_cycles(served) -> None:
    s, px = served

    async def go() -> list[tuple[list[dict[str, Any]], float]]:
        async with connect(ws_url(px.base_url), additional_headers={
                "Authorization": f"Bearer {s.key}"}) as ws:
            warm, _ = await turn(ws, create("hi", generate=False))
            one = await turn(ws, create("write a python function", warm[-1]["response"]["id"],
                                        max_output_tokens=40))
            two = await turn(ws, create("now in rust", one[0][-1]["response"]["id"],
                                        max_output_tokens=40))
            return [(warm, 0.0), one, two]

    (warm, _), (one, t1), (two, t2) = asyncio.run(go())
    assert [e["type"] for e in warm] == ["response.created", "response.in_progress",
                                         "response.completed"]
    for events, first in ((one, t1), (two, t2)):
        assert events[-1]["type"] in DONE and first >= 0.12
        seqs = [e["sequence_number"] for e in events]
        assert seqs == list(range(len(events)))  # renumbered after splitting
    rows = s.rows("SELECT * FROM cycles WHERE transport = 'websocket' ORDER BY turn")
    rows = [r._mapping for r in rows]
    assert [r["turn"] for r in rows] == [1, 2]  # the warm-up is not a cycle
    assert rows[0]["connection_id"] == rows[1]["connection_id"] is not None
    for r, events in zip(rows, (one, two), strict=True):
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert r["protocol"] == "responses" and r["stream"] and r["status"] == "ok"
        assert r["content_text"] == text and r["upstream_response_id"] == events[-1][
            "response"]["id"]
        assert r["experienced_ttft_ms"] >= 120 and on_time(r)
        assert r["tokens_completion"] == events[-1]["response"]["usage"]["output_tokens"]
        assert r["http_status"] == 101 and r["participant_id"] == "p01"
    assert rows[1]["upstream_response_id"].endswith(rows[1]["id"])  # cycle id reached the mock


def test_per_message_compression_is_declined(served) -> None:
    """A client offering permessage-deflate (websockets does by default) gets plain frames:
    compressing one small frame per token would cost the proxy's loop more than it saves."""
    s, px = served

    async def go() -> tuple[str | None, str]:
        async with connect(ws_url(px.base_url), additional_headers={"x-api-key": s.key}) as ws:
            assert "permessage-deflate" in ws.request.headers.get("Sec-WebSocket-Extensions")
            events, _ = await turn(ws, create("hello", max_output_tokens=5))
            return ws.response.headers.get("Sec-WebSocket-Extensions"), events[-1]["type"]

    extensions, last = asyncio.run(go())
    assert extensions is None and last in DONE


def test_bad_messages_get_error_events_and_the_socket_stays_usable(served) -> None:
    s, px = served
    n_before = s.rows("SELECT count(*) FROM cycles")[0][0]

    async def go() -> list[dict[str, Any]]:
        out = []
        async with connect(ws_url(px.base_url), additional_headers={"x-api-key": s.key}) as ws:
            for bad in ("{not json", json.dumps({"type": "response.cancel"}), "[1]"):
                await ws.send(bad)
                out.append(json.loads(await ws.recv()))
            # The upstream refuses this one (no model): a recorded cycle, status error.
            refused, _ = await turn(ws, json.dumps({"type": "response.create", "input": "x"}))
            out.append(refused[-1])
            good, _ = await turn(ws, create("hello", max_output_tokens=5))
            out.append(good[-1])
        return out

    got = asyncio.run(go())
    for ev in got[:4]:
        assert ev["type"] == "error" and ev["status"] == 400
        assert ev["error"]["type"] == "invalid_request_error" and ev["error"]["message"]
    assert [e["error"]["code"] for e in got[:3]] == ["invalid_json", "unsupported_type",
                                                      "unsupported_type"]
    assert got[4]["type"] in DONE
    rows = s.rows("SELECT status, turn FROM cycles ORDER BY t_request_ns")[n_before:]
    assert [tuple(r) for r in rows] == [("error", 1), ("ok", 2)]


def test_a_message_the_proxy_fails_on_gets_an_error_and_the_socket_stays_usable(
        served, monkeypatch) -> None:
    """A bug met while a message is read (here: the conversation check) or a warm-up relayed
    (here: the upstream socket) is an ``error`` message (500, ``proxy_error``) on a socket
    that stays usable; nothing is recorded for it. Before, the connection ended without a
    close frame, and a client waiting for an answer waited for ever."""
    from flowtrial.instrumentation.proxy import upstream

    s, px = served
    tracker = px.app.state.proxy.turns
    checked = tracker.foreign_response

    async def foreign(pid: str, previous: str | None) -> bool:
        if previous == "resp_boom":
            raise RuntimeError("injected")
        return bool(await checked(pid, previous))

    real_turn = upstream._MockSocket.turn

    def relay(self: Any, message: Any, headers: dict[str, str]) -> Any:
        if isinstance(message, dict) and message.get("generate") is False:
            raise RuntimeError("injected")
        return real_turn(self, message, headers)

    monkeypatch.setattr(tracker, "foreign_response", foreign)
    monkeypatch.setattr(upstream._MockSocket, "turn", relay)
    n_before = s.rows("SELECT count(*) FROM cycles")[0][0]

    async def go() -> list[dict[str, Any]]:
        async with connect(ws_url(px.base_url), additional_headers={"x-api-key": s.key}) as ws:
            out = []
            for message in (create("hi", "resp_boom"), create("hi", generate=False)):
                await ws.send(message)
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            good, _ = await turn(ws, create("hello", max_output_tokens=5))
            return [*out, good[-1]]

    got = asyncio.run(go())
    for ev in got[:2]:
        assert (ev["type"], ev["status"], ev["error"]["code"]) == ("error", 500, "proxy_error")
        assert "RuntimeError" not in ev["error"]["message"]  # no internals on the wire
    assert got[2]["type"] in DONE
    assert s.rows("SELECT count(*) FROM cycles")[0][0] == n_before + 1


def test_handshake_without_a_valid_key_is_refused_with_401(served) -> None:
    s, px = served

    async def go(headers: dict[str, str]) -> int:
        try:
            async with connect(ws_url(px.base_url), additional_headers=headers):
                return 101
        except websockets.InvalidStatus as exc:
            assert json.loads(exc.response.body)["error"]["code"] == "invalid_api_key"
            return exc.response.status_code

    assert asyncio.run(go({})) == 401
    assert asyncio.run(go({"Authorization": "Bearer ft_unknown"})) == 401


def test_disconnect_mid_turn_is_recorded_abandoned(make_study) -> None:
    s = make_study({"upstream": {"mock": {"tokens_per_second": 20000, "ttft_ms": 2}},
                    "arms": [{"name": "slow", "ttft_ms": 50, "tokens_per_second": 50}]})
    with serve_proxy(s.db, s.config) as px:
        async def go() -> None:
            async with connect(ws_url(px.base_url), additional_headers={
                    "Authorization": f"Bearer {s.key}"}) as ws:
                await ws.send(create("write a long python module", max_output_tokens=200))
                while json.loads(await ws.recv())["type"] != "response.output_text.delta":
                    pass

        asyncio.run(go())
        deadline = time.monotonic() + 5
        while not s.rows("SELECT 1 FROM cycles") and time.monotonic() < deadline:
            time.sleep(0.05)
    row = s.rows("SELECT status, error, transport, tokens_sent FROM cycles")[0]
    assert row[0] == "abandoned" and row[1] == "client disconnected" and row[2] == "websocket"
    assert 0 < row[3] < 200


@pytest.mark.timing
def test_real_upstream_over_websocket(make_study, monkeypatch) -> None:
    """[upstream.openai] pointing at the simulated model served by uvicorn: the proxy opens
    one upstream WebSocket per client connection (with the upstream key) and shapes as with
    the mock. `timing`: "no violation" means every turn within 5 ms of its schedule, which a
    busy machine (a test run at nice 19 beside others) missed in about 1 run in 10."""
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app

    handshakes: list[dict[str, str]] = []
    inner = create_mock_app(MockModel(tokens_per_second=20000, ttft_ms=2))

    async def upstream_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            handshakes.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await inner(scope, receive, send)

    monkeypatch.setenv("FT_TEST_OPENAI_KEY", "sk-upstream-test")
    with run_asgi_server(upstream_app) as up:
        s = make_study({"capture": {"content": "full"},
                        "upstream": {"kind": "openai", "openai": {
                            "base_url": up + "/v1", "api_key_env": "FT_TEST_OPENAI_KEY"}},
                        "arms": [{"name": "a", "ttft_ms": 100, "tokens_per_second": 800}]})
        with serve_proxy(s.db, s.config) as px:
            async def go() -> list[list[dict[str, Any]]]:
                async with connect(ws_url(px.base_url), additional_headers={
                        "Authorization": f"Bearer {s.key}",
                        "OpenAI-Beta": "responses_websockets=2026-02-06"}) as ws:
                    warm, _ = await turn(ws, create("hi", generate=False))
                    one, _ = await turn(ws, create("python please", warm[-1]["response"]["id"],
                                                   max_output_tokens=30))
                    two, _ = await turn(ws, create("more", one[-1]["response"]["id"],
                                                   max_output_tokens=30))
                    return [warm, one, two]

            warm, one, two = asyncio.run(go())
    assert len(handshakes) == 1  # one upstream connection for the client's connection
    assert handshakes[0]["authorization"] == "Bearer sk-upstream-test"
    assert handshakes[0]["openai-beta"] == "responses_websockets=2026-02-06"
    assert one[-1]["type"] in DONE and two[-1]["type"] in DONE
    rows = s.rows("SELECT turn, status, upstream, experienced_ttft_ms, violation, content_text "
                  "FROM cycles ORDER BY turn")
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, "ok", "openai:127.0.0.1"),
                                                   (2, "ok", "openai:127.0.0.1")]
    assert all(r[3] >= 100 and not r[4] for r in rows), [r[:5] for r in rows]
    assert rows[1][5] == "".join(e["delta"] for e in two
                                 if e["type"] == "response.output_text.delta")


def test_unreachable_upstream_is_an_error_event(make_study, monkeypatch) -> None:
    monkeypatch.setenv("FT_TEST_OPENAI_KEY", "sk-upstream-test")
    s = make_study({"upstream": {"kind": "openai", "openai": {
        "base_url": f"http://127.0.0.1:{closed_port()}/v1", "api_key_env": "FT_TEST_OPENAI_KEY"}}})
    app = create_proxy_app(s.database, s.config)
    with run_asgi_server(app) as url:
        async def go() -> list[dict[str, Any]]:
            async with connect(ws_url(url), additional_headers={
                    "Authorization": f"Bearer {s.key}"}) as ws:
                a, _ = await turn(ws, create("x"))
                b, _ = await turn(ws, create("y"))
                return [a[-1], b[-1]]

        got = asyncio.run(go())
    assert all(e["type"] == "error" and e["status"] == 502 and
               e["error"]["code"] == "upstream_unreachable" for e in got)
    rows = s.rows("SELECT status, turn, transport FROM cycles ORDER BY turn")
    assert [tuple(r) for r in rows] == [("upstream_error", 1, "websocket"),
                                        ("upstream_error", 2, "websocket")]
