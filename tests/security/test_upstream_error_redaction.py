"""No key leaks through an upstream's error text.

An upstream refusing a key often quotes it ("Incorrect API key provided: sk-…"), and an
error may quote the request, which can hold the participant's own key. The upstream here is
the real misbehaving server of :mod:`tests.reliability.faulty_upstream` asked to do exactly
that: a 401 whose JSON body quotes the key it got and the request, an in-stream error event
quoting them (SSE and the Responses WebSocket mode), for OpenAI Chat (streaming and not),
Responses and Anthropic Messages. Neither the study's upstream keys nor the participant's key
may reach the client or ``cycles.error``; the redaction marker stands in their place and the
cycle's status is recorded.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.proxy.scrub import REDACTED, Scrubber
from flowtrial.study.config import parse_study
from tests.instrumentation.conftest import StudySetup, build_study
from tests.reliability.faulty_upstream import FaultyUpstream, faulty_upstream

OPENAI_VAR = "FT_REDACT_OPENAI_KEY"
ANTHROPIC_VAR = "FT_REDACT_ANTHROPIC_KEY"
OPENAI_KEY = "sk-proj-" + secrets.token_hex(20)
ANTHROPIC_KEY = "sk-ant-api03-" + secrets.token_hex(20)

REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "{prompt}"}]}),
    "responses": ("/v1/responses", {"input": "{prompt}"}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "{prompt}"}]}),
}


class Served:
    def __init__(self, study: StudySetup, proxy: Any, upstream: FaultyUpstream) -> None:
        self.s, self.px, self.up = study, proxy, upstream
        self.key = study.key

    @property
    def url(self) -> str:
        return str(self.px.base_url)

    def post(self, protocol: str, fault: str, stream: bool) -> httpx.Response:
        """A request whose prompt holds the participant's own key (echoed by the fault)."""
        path, body = REQUESTS[protocol]
        prompt = f"my flowtrial key is {self.key}, is that ok?"
        body = json.loads(json.dumps(body).replace("{prompt}", prompt))
        headers = {"x-fault": fault}
        headers["x-api-key" if protocol == "messages" else "authorization"] = (
            self.key if protocol == "messages" else f"Bearer {self.key}")
        return httpx.post(self.url + path, timeout=20, headers=headers, json={
            "model": "m", "max_tokens": 20, "stream": stream, **body})

    def row(self, cid: str) -> Any:
        rows = self.s.rows("SELECT status, http_status, error FROM cycles WHERE id = :i",
                           {"i": cid})
        assert len(rows) == 1, f"cycle {cid} not recorded"
        return rows[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    mp = pytest.MonkeyPatch()
    mp.setenv(OPENAI_VAR, OPENAI_KEY)
    mp.setenv(ANTHROPIC_VAR, ANTHROPIC_KEY)
    with faulty_upstream() as up:
        s = build_study(tmp_path_factory.mktemp("redact"), {"upstream": {
            "kind": "openai", "timeout_s": 5,
            "openai": {"base_url": up.base_url + "/v1", "api_key_env": OPENAI_VAR},
            "anthropic": {"base_url": up.base_url, "api_key_env": ANTHROPIC_VAR}}})
        with serve_proxy(s.db, s.config, grace_s=3) as px:
            yield Served(s, px, up)
        s.database.dispose()
    mp.undo()


def assert_clean(sv: Served, text: str) -> None:
    """No key in ``text``, and the marker where they were."""
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, sv.key):
        assert secret not in text, text
    assert REDACTED in text, text


def upstream_key(protocol: str) -> str:
    return ANTHROPIC_KEY if protocol == "messages" else OPENAI_KEY


@pytest.mark.parametrize("protocol,stream", [
    ("chat", False), ("chat", True), ("messages", False), ("messages", True),
    ("responses", True)])
def test_error_status_quoting_the_keys_is_redacted(served: Served, protocol: str,
                                                   stream: bool) -> None:
    """A 401 whose body quotes the upstream key and the request: the client gets the 401 in
    the protocol's shape, both keys redacted; the row says ``error`` / 401, redacted too."""
    n_echoes = len(served.up.requests)
    r = served.post(protocol, "echo_key:401", stream)
    assert served.up.requests[n_echoes:] == [(REQUESTS[protocol][0], "echo_key:401")]
    assert r.status_code == 401, r.text
    assert_clean(served, r.text)
    body = r.json()
    message = body["error"]["message"]
    if protocol == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["code"] == "invalid_api_key"
    assert message.startswith(f"Incorrect API key provided: {REDACTED}. Request was: ")
    status, http_status, error = served.row(r.headers["x-flowtrial-cycle-id"])
    assert (status, http_status) == ("error", 401)
    assert_clean(served, error)
    assert error == message


@pytest.mark.parametrize("protocol", ["chat", "messages"])
def test_error_quoting_the_key_in_json_escapes_is_redacted(served: Served, protocol: str
                                                           ) -> None:
    """The upstream spells the key in ``\\uXXXX`` escapes (valid JSON, invisible to a plain
    search): the client and the row still get it redacted."""
    r = served.post(protocol, "echo_key_escaped:401", False)
    assert r.status_code == 401, r.text
    key = upstream_key(protocol)
    escaped = "".join(f"\\u{ord(c):04x}" for c in key)
    assert escaped not in r.text and key not in json.dumps(r.json()), r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"Incorrect API key provided: {REDACTED}. Request was: ")
    assert sv_key_absent(served, message)
    _, _, error = served.row(r.headers["x-flowtrial-cycle-id"])
    assert key not in error and escaped not in error and REDACTED in error


def sv_key_absent(sv: Served, text: str) -> bool:
    return all(s not in text for s in (OPENAI_KEY, ANTHROPIC_KEY, sv.key))


@pytest.mark.parametrize("protocol,stream", [("chat", False), ("chat", True),
                                             ("messages", True)])
def test_response_header_quoting_the_key_is_redacted(served: Served, protocol: str,
                                                     stream: bool) -> None:
    """A successful answer whose response header echoes the upstream key: the header still
    reaches the client (gateways put request ids there), with the key redacted."""
    r = served.post(protocol, "echo_key_header", stream)
    assert r.status_code == 200, r.text
    assert r.headers["x-echo-auth"] == f"Bearer {REDACTED}"
    assert all(upstream_key(protocol) not in v for v in r.headers.values())
    assert r.headers["x-request-id"] == "req_faulty"  # other headers pass untouched
    status, _, _ = served.row(r.headers["x-flowtrial-cycle-id"])
    assert status == "ok"


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_sse_error_event_quoting_the_keys_is_redacted(served: Served, protocol: str) -> None:
    """A stream that ends with the upstream's error event quoting the keys: the client gets
    what came before and the error event, redacted; the row is ``upstream_error``."""
    r = served.post(protocol, "echo_key_sse:3", True)
    assert r.status_code == 200, r.text
    assert_clean(served, r.text)
    last = r.text.strip().split("\n\n")[-1]
    data = json.loads(last.split("data: ", 1)[1])
    message = data["message"] if protocol == "responses" else data["error"]["message"]
    assert message.startswith(f"Incorrect API key provided: {REDACTED}.")
    if protocol != "chat":
        assert last.startswith("event: error\n")
    status, http_status, error = served.row(r.headers["x-flowtrial-cycle-id"])
    assert (status, http_status) == ("upstream_error", 200)
    assert_clean(served, error)


def test_websocket_error_event_quoting_the_keys_is_redacted(served: Served) -> None:
    """Responses WebSocket mode: the upstream's ``error`` event quotes the key of its
    handshake and the turn's message; the client and the row get it redacted."""

    async def go() -> list[dict[str, Any]]:
        async with connect(served.url.replace("http", "ws") + "/v1/responses",
                           additional_headers={"authorization": f"Bearer {served.key}"}) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "m",
                                      "input": f"my key is {served.key}",
                                      "max_output_tokens": 20, "x_fault": "echo_key:3"}))
            events = []
            while True:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
                if events[-1]["type"] in ("error", "response.completed"):
                    return events

    events = asyncio.run(go())
    last = events[-1]
    assert last["type"] == "error" and last["status"] == 500, events
    assert_clean(served, json.dumps(events))
    rows = served.s.rows("SELECT status, http_status, error FROM cycles WHERE transport = "
                         "'websocket' ORDER BY t_request_ns DESC")
    status, http_status, error = rows[0]
    assert (status, http_status) == ("upstream_error", 101)
    assert_clean(served, error)


def test_count_tokens_error_quoting_the_key_is_redacted(served: Served) -> None:
    """``count_tokens`` is passed through without a cycle: the upstream client itself redacts
    the key it sent from an error reply."""
    r = httpx.post(served.url + "/v1/messages/count_tokens", timeout=20, headers={
        "x-api-key": served.key, "x-fault": "echo_key:401"},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401
    assert ANTHROPIC_KEY not in r.text and REDACTED in r.text


def test_scrubber_covers_every_upstream_key_and_the_participant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key variable the study names is redacted (whichever upstream quoted it), as is
    the participant's key, also in JSON-escaped form; short values are left alone."""
    monkeypatch.setenv(OPENAI_VAR, "sk-a/b" + "1" * 20)
    monkeypatch.setenv(ANTHROPIC_VAR, ANTHROPIC_KEY)
    config = parse_study({"study": {"name": "x", "design": "parallel"}, "arms": [{"name": "a"}],
                          "upstream": {"kind": "openai", "openai": {
                              "base_url": "http://127.0.0.1:1/v1", "api_key_env": OPENAI_VAR},
                              "anthropic": {"base_url": "http://127.0.0.1:1",
                                            "api_key_env": ANTHROPIC_VAR}}})
    scrub = Scrubber.for_request(config, "ft_participant_key_123")
    text = f"a {ANTHROPIC_KEY} b sk-a/b{'1' * 20} c ft_participant_key_123 d"
    assert scrub.text(text) == f"a {REDACTED} b {REDACTED} c {REDACTED} d"
    raw = b'{"m": "sk-a\\/b' + b"1" * 20 + b'"}'  # "/" escaped, as some servers write it
    assert scrub.raw(raw) == b'{"m": "' + REDACTED.encode() + b'"}'
    assert Scrubber(["abc", None, ""]).text("abc") == "abc"
    # Any escape inside a JSON string: decoded, checked, re-encoded only if it held a key.
    spelled = "".join(f"\\u{ord(c):04x}" for c in ANTHROPIC_KEY[:5]) + ANTHROPIC_KEY[5:]
    doc = '{"m": "key ' + spelled + ' \\"quoted\\"", "n": "a\\u00e9\\/b"}'
    assert json.loads(scrub.text(doc)) == {"m": f'key {REDACTED} "quoted"', "n": "aé/b"}
    assert scrub.text(doc).endswith('"n": "a\\u00e9\\/b"}')  # untouched: no key in it
    assert json.loads(scrub.raw(doc.encode())) == json.loads(scrub.text(doc))
    sse = b"event: error\ndata: " + doc.encode() + b"\n\n\xff"
    assert ANTHROPIC_KEY[5:].encode() not in scrub.raw(sse)
    assert scrub.raw(sse).endswith(b"\n\n\xff")
    assert scrub.headers([("x-a", f"Bearer {ANTHROPIC_KEY}"), ("x-b", "1")]) == [
        ("x-a", f"Bearer {REDACTED}"), ("x-b", "1")]
