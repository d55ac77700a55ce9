"""Large model request bodies are parsed off the token loop (:mod:`.body_parser`): served and
classified the same, refused in the protocol's shape when broken or when too many wait, and
the loop keeps its timers while a 20 MB body is read."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.instrumentation.proxy.body_parser import OFF_LOOP_BYTES, BodyParser, parse_request
from tests.instrumentation.loop_stalls import stalls_during
from tests.instrumentation.servers import run_asgi_server


def _chat(n: int, stream: bool = False) -> bytes:
    return json.dumps({"model": "m", "stream": stream, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
        for i in range(n)]}).encode()


def test_a_large_body_is_served_and_classified_as_a_small_one_would_be(make_study: Any) -> None:
    s = make_study()
    app = create_proxy_app(s.database, s.config)
    key = {"authorization": f"Bearer {s.key}", "content-type": "application/json"}
    big = _chat(20_001)  # ~0.6 MB: parsed in the process
    assert len(big) > OFF_LOOP_BYTES
    with run_asgi_server(app) as url:
        r = httpx.post(url + "/v1/chat/completions", content=big, headers=key, timeout=60)
        assert r.status_code == 200, r.text
        parser = app.state.proxy.parser
        assert parser.offloaded == 1
        # Broken JSON that is large: the same 400 as a small one, in OpenAI's shape...
        r = httpx.post(url + "/v1/chat/completions", content=big[:-1], headers=key, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        assert "not valid JSON" in r.json()["error"]["message"]
        # ... and Anthropic's on the Messages path (a JSON array is no request either).
        r = httpx.post(url + "/v1/messages", content=b"[" + b"1," * OFF_LOOP_BYTES + b"1]",
                       headers=key, timeout=60)
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert "must be a JSON object" in r.json()["error"]["message"]
        assert parser.offloaded == 3
        # Saturated: the client gets 503 + Retry-After; nothing else waits.
        parser.max_waiting = 0
        r = httpx.post(url + "/v1/chat/completions", content=big, headers=key, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "parse_busy"
        small = httpx.post(url + "/v1/chat/completions", content=_chat(3), headers=key)
        assert small.status_code == 200
    rows = s.database.engine.connect().exec_driver_sql(
        "SELECT request_kind, input_key FROM cycles ORDER BY t_request_ns").all()
    view = parse_request("chat", None, big)
    assert rows[0][1] == view.input_key and rows[0][1] is not None
    assert len(rows) == 2  # the large one and the small one; refusals are not cycles


def test_the_loop_keeps_its_timers_while_a_20_mb_body_is_parsed() -> None:
    """The worst shape (340k short messages, 20 MB): on the loop it stalls every timer for
    the parse; off the loop the longest stall is a small fraction of it."""
    body = _chat(340_000)

    async def longest_stall(work: Any) -> tuple[float, float]:
        stalls = await stalls_during(work)
        return stalls.longest, stalls.took

    async def main() -> tuple[tuple[float, float], tuple[float, float]]:
        parser = BodyParser()
        await parser.parse("chat", None, _chat(20_000))  # the process is up
        try:
            async def on_loop() -> None:
                parse_request("chat", None, body)

            async def off_loop() -> None:
                assert (await parser.parse("chat", None, body)).view is not None

            return await longest_stall(on_loop), await longest_stall(off_loop)
        finally:
            await asyncio.to_thread(parser.close)

    (on_stall, on_took), (off_stall, off_took) = asyncio.run(main())
    print(f"\non the loop: stall {on_stall * 1e3:.0f} ms (parse {on_took * 1e3:.0f} ms); "
          f"off the loop: stall {off_stall * 1e3:.0f} ms (round trip {off_took * 1e3:.0f} ms)")
    assert on_stall > 0.2  # the problem is real on this machine
    assert off_stall < on_stall / 4, (on_stall, off_stall)


def test_a_compressed_model_request_is_refused_with_415_in_the_protocols_shape(
        make_study: Any) -> None:
    """Codex signed in with ChatGPT may send zstd-compressed requests: the proxy reads JSON
    as sent, so it answers 415 naming the client setting, in each protocol's error shape, and
    records nothing; the same request uncompressed is served."""
    import gzip

    s = make_study()
    app = create_proxy_app(s.database, s.config)
    body = json.dumps({"model": "m", "input": "hello", "max_output_tokens": 8}).encode()
    key = {"authorization": f"Bearer {s.key}", "content-type": "application/json"}
    with run_asgi_server(app) as url:
        for encoding, data in (("zstd", b"(\xb5/\xfd" + body), ("gzip", gzip.compress(body))):
            r = httpx.post(url + "/v1/responses", content=data, timeout=30,
                           headers={**key, "content-encoding": encoding})
            assert r.status_code == 415, r.text
            err = r.json()["error"]
            assert err["code"] == "unsupported_content_encoding"
            assert encoding in err["message"] and "enable_request_compression" in err["message"]
        r = httpx.post(url + "/v1/messages/count_tokens", timeout=30, content=gzip.compress(
            b'{"model": "m", "messages": []}'), headers={**key, "content-encoding": "gzip"})
        assert r.status_code == 415 and r.json()["type"] == "error"  # Anthropic's shape
        assert s.database.engine.connect().exec_driver_sql(
            "SELECT COUNT(*) FROM cycles").scalar() == 0
        r = httpx.post(url + "/v1/responses", content=body, headers=key, timeout=30)
        assert r.status_code == 200, r.text
