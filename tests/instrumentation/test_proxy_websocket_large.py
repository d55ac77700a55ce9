"""Large Responses WebSocket messages are read off the token loop (:mod:`.socket_messages`,
:mod:`.body_parser`) and go upstream as fragments (``upstream.FRAGMENT_CHARS``): a large turn
is served, recorded and classified as a small one would be, the arm's model replaces the
client's, refusals keep their shapes and the socket, and the loop keeps its timers."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.proxy.body_parser import OFF_LOOP_BYTES, BodyParser
from flowtrial.instrumentation.proxy.socket_messages import read_socket_message
from tests.instrumentation.loop_stalls import stalls_during
from tests.instrumentation.servers import run_asgi_server

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
DONE = {"response.completed", "response.incomplete"}  # incomplete: max_output_tokens hit


def big_create(n: int, **extra: Any) -> str:
    """A response.create of ``n`` input messages, the last the person's (~30 bytes each)."""
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
             for i in range(n)] + [{"role": "user", "content": "and now python please"}]
    return json.dumps({"type": "response.create", "model": "client-model", "input": items,
                       "max_output_tokens": 24, **extra})


async def turn(ws: Any, message: str) -> list[dict[str, Any]]:
    await ws.send(message)
    events = []
    while True:
        ev = json.loads(await ws.recv())
        events.append(ev)
        if ev["type"] in TERMINAL:
            return events


async def longest_stall(work: Any) -> float:
    """The longest lateness (s) of a 2 ms timer on the loop while ``work`` runs."""
    return (await stalls_during(work)).longest


def test_a_large_message_is_read_off_the_loop_and_served_as_a_small_one(
        make_study: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowtrial.instrumentation.mock_model import MockModel
    from flowtrial.instrumentation.mock_model.app import create_mock_app

    received: list[dict[str, Any]] = []  # what the upstream got, message by message
    inner = create_mock_app(MockModel(tokens_per_second=20000, ttft_ms=2))

    async def upstream_app(scope: Any, receive: Any, send: Any) -> None:
        async def seen() -> Any:
            msg = await receive()
            if msg["type"] == "websocket.receive" and msg.get("text"):
                received.append(json.loads(msg["text"]))
            return msg
        await inner(scope, seen if scope["type"] == "websocket" else receive, send)

    monkeypatch.setenv("FT_TEST_OPENAI_KEY", "sk-upstream-test")
    big = big_create(20_000)  # ~0.6 MB: read in the parse process, sent as fragments
    assert len(big) > OFF_LOOP_BYTES
    with run_asgi_server(upstream_app) as up:
        s = make_study({"upstream": {"kind": "openai", "openai": {
                            "base_url": up + "/v1", "api_key_env": "FT_TEST_OPENAI_KEY"}},
                        "arms": [{"name": "a", "ttft_ms": 50, "model": "arm-model"}]})
        with serve_proxy(s.db, s.config) as px:
            parser = px.app.state.proxy.parser

            async def go() -> dict[str, list[dict[str, Any]]]:
                async with connect(px.base_url.replace("http://", "ws://") + "/v1/responses",
                                   additional_headers={"Authorization": f"Bearer {s.key}"},
                                   max_size=None) as ws:
                    out = {"turn": await turn(ws, big)}
                    out["broken"] = await turn(ws, big[:-1])
                    out["cancel"] = await turn(ws, big.replace('"response.create"',
                                                               '"response.cancel"', 1))
                    out["warmup"] = await turn(ws, big_create(20_000, generate=False))
                    parser.max_waiting = 0  # saturated: refused, the socket stays usable
                    out["busy"] = await turn(ws, big)
                    parser.max_waiting = 8
                    out["small"] = await turn(ws, big_create(3))
                    return out

            out = asyncio.run(go())
            offloaded = parser.offloaded
    assert out["turn"][-1]["type"] in DONE, out["turn"][-1]
    assert out["turn"][-1]["response"]["model"] == "arm-model"
    codes = {k: v[-1].get("error", {}).get("code") for k, v in out.items()}
    assert codes["broken"] == "invalid_json" and codes["cancel"] == "unsupported_type"
    assert codes["busy"] == "parse_busy" and out["busy"][-1]["status"] == 503
    assert out["warmup"][-1]["type"] == "response.completed"
    assert out["small"][-1]["type"] in DONE
    # The turn (read, then its model rewritten), the broken one, the cancel, the warm-up;
    # not "busy".
    assert offloaded == 5
    # Upstream: the large turn whole, in the arm's model; the warm-up as it came.
    sent = json.loads(big)
    assert received[0] == {**sent, "model": "arm-model"}
    assert received[1]["generate"] is False and len(received[1]["input"]) == 20_001
    rows = s.rows("SELECT turn, status, model, served_model, input_key, request_kind "
                  "FROM cycles ORDER BY t_request_ns")
    # The large turn and the small one are cycles; refusals and the warm-up are not.
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (1, "ok", "client-model", "arm-model"), (2, "ok", "client-model", "arm-model")]
    # Classified as the same message read on the loop would be.
    small_read = read_socket_message(big, 10**9)
    assert rows[0][4] == small_read.input_key and rows[0][4] is not None
    assert rows[0][5] == "human"  # the person's new prompt, as on the loop


@pytest.mark.timing
def test_the_loop_keeps_its_timers_while_a_7_mb_message_is_read() -> None:
    """The densest shape (200k short items, 7 MB): read on the loop it stalls every timer;
    through the body parser the longest stall is a small fraction of that."""
    raw = json.dumps({"type": "response.cancel", "input": [{"role": "user", "content": "hi"}]
                      * 200_000})

    async def main() -> tuple[float, float]:
        parser = BodyParser()
        await parser.read_socket_message(big_create(20_000), 10**8)  # the process is up
        try:
            async def on_loop() -> None:
                assert read_socket_message(raw, 10**8).error is not None

            async def off_loop() -> None:
                assert (await parser.read_socket_message(raw, 10**8)).error is not None

            return await longest_stall(on_loop), await longest_stall(off_loop)
        finally:
            await asyncio.to_thread(parser.close)

    on_stall, off_stall = asyncio.run(main())
    print(f"\non the loop: stall {on_stall * 1e3:.0f} ms; off the loop: {off_stall * 1e3:.0f} ms")
    assert on_stall > 0.05  # the problem is real on this machine (90-200 ms here)
    assert off_stall < on_stall / 4, (on_stall, off_stall)


@pytest.fixture
def upstream_process() -> Iterator[str]:
    """The simulated model in its own process (its reading of a large message must not take
    this process's GIL); yields its ``ws://…/v1/responses``."""
    code = ("import typer; from flowtrial.instrumentation.mock_model.commands import "
            "mock_model; typer.run(mock_model)")
    proc = subprocess.Popen([sys.executable, "-c", code, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if m := re.search(r"simulated model at http(://\S+/v1)", line):
                yield "ws" + m.group(1) + "/responses"
                break
        else:
            pytest.fail("the simulated model did not start")
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.timing
def test_a_large_message_goes_upstream_in_fragments_the_loop_keeps_its_timers(
        upstream_process: str) -> None:
    """permessage-deflate compresses on the loop: a 3 MB message of text sent whole holds
    every timer for the compression; sent as fragments, the longest stall is a fraction."""
    from flowtrial.instrumentation.proxy import upstream as up

    rng = random.Random(3)
    alphabet = "abcdefghijklmnop qrstuvwxyz_(){}:=.,\n    "
    text = json.dumps({"type": "response.create", "model": "m", "generate": False, "input": [
        {"role": "user", "content": "".join(rng.choices(alphabet, k=450))}
        for _ in range(6_500)]})

    async def main() -> tuple[float, float]:
        sock = up._HttpSocket(upstream_process, {}, up.httpx.Timeout(60))

        async def send() -> None:
            events = [json.loads(e) async for e in sock.turn(text, {})]
            assert events[-1]["type"] == "response.completed", events[-1]

        async def send_whole() -> None:
            up.FRAGMENT_CHARS, kept = 10**9, up.FRAGMENT_CHARS
            try:
                await send()
            finally:
                up.FRAGMENT_CHARS = kept

        try:
            await send()  # connected, deflate negotiated
            whole = await longest_stall(send_whole)
            return whole, await longest_stall(send)
        finally:
            await sock.close()

    whole, fragments = asyncio.run(main())
    print(f"\nsent whole: stall {whole * 1e3:.0f} ms; as fragments: {fragments * 1e3:.0f} ms")
    assert whole > 0.05  # the problem is real on this machine
    assert fragments < whole / 4, (whole, fragments)
