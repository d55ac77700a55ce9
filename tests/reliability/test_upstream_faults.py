"""Upstream faults at the socket level, for every protocol the proxy speaks.

The upstream is a real HTTP/1.1 (and WebSocket) server on a loopback port
(:mod:`tests.reliability.faulty_upstream`) that answers like the simulated model until asked
to misbehave: it dies mid-chunk (FIN or RST), stalls, answers 429/5xx or an HTML page, sends
malformed SSE, ends a stream early, mislabels or replaces the stream, or is not there at all.
So the proxy's real upstream client (``HttpUpstream`` over the lean HTTP/1.1 transport, and
the ``websockets`` client) is what meets each fault. Clients are the official ``openai`` and
``anthropic`` SDKs. For each fault: the client gets the partial stream and then a
protocol-correct error (or an error status in the protocol's shape), the cycle row says
``upstream_error`` with its http_status and error, and the proxy goes on serving — including a
healthy stream running at the same time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.study.participants import assignments_for
from tests.instrumentation.conftest import StudySetup, build_study
from tests.instrumentation.proxy_servers import closed_port
from tests.reliability.faulty_upstream import FaultyUpstream, faulty_upstream

pytestmark = pytest.mark.usefixtures("fine_gil_switching")

KEY_VAR = "FT_RELIABILITY_UPSTREAM_KEY"
PROMPT = "write a python class for a stack"
PROTOCOLS = ("chat", "completions", "responses", "messages")
TARGET_TTFT_MS = 30.0
SLOW_TPS = 40.0


class Served:
    """The module's proxy, its study and the faulty upstream behind it."""

    def __init__(self, study: StudySetup, proxy: Any, upstream: FaultyUpstream) -> None:
        self.s = study
        self.px = proxy
        self.up = upstream
        arm_of = {pid: assignments_for(study.database, pid)[0] for pid in study.keys}
        #: The fast arm's participant (every SDK call) and the slow arm's (a long stream).
        self.key = next(k for pid, k in study.keys.items() if arm_of[pid] == "a")
        self.slow_key = next(k for pid, k in study.keys.items() if arm_of[pid] == "slow")

    @property
    def url(self) -> str:
        return str(self.px.base_url)

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0,
                             timeout=20)

    def ant(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.key, max_retries=0,
                                   timeout=20)

    def row(self, cid: str) -> Any:
        deadline = time.monotonic() + 5
        while True:
            rows = self.s.rows("SELECT * FROM cycles WHERE id = :i", {"i": cid})
            if rows or time.monotonic() > deadline:
                assert len(rows) == 1, f"cycle {cid} not recorded"
                return rows[0]._mapping
            time.sleep(0.02)


def upstream_study(directory: Path, base: str) -> StudySetup:
    """A shaped study whose OpenAI and Anthropic sides both point at ``base``; of its two
    participants one is on a fast arm, the other on a slow one (balanced blocks of two)."""
    return build_study(directory, {
        "upstream": {"kind": "openai", "timeout_s": 0.5,
                     "openai": {"base_url": base + "/v1", "api_key_env": KEY_VAR},
                     "anthropic": {"base_url": base, "api_key_env": KEY_VAR}},
        "capture": {"content": "full"},
        "arms": [{"name": "a", "ttft_ms": TARGET_TTFT_MS, "tokens_per_second": 2000},
                 {"name": "slow", "ttft_ms": TARGET_TTFT_MS, "tokens_per_second": SLOW_TPS}],
    }, participants=("p01", "p02"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_VAR, "sk-reliability-upstream-key")
    with faulty_upstream() as up:
        s = upstream_study(tmp_path_factory.mktemp("faults"), up.base_url)
        with serve_proxy(s.db, s.config, grace_s=3) as px:
            yield Served(s, px, up)
        s.database.dispose()
    mp.undo()


# ------------------------------------------------------------------ clients, per protocol
def stream_call(sv: Served, protocol: str, fault: str, max_tokens: int = 60
                ) -> tuple[str, str, BaseException | None, list[str]]:
    """One streaming request through the SDK: (cycle id, text received, the exception the
    SDK raised or None, event types seen)."""
    extra = {"x-fault": fault} if fault else {}
    text, types, err = [], [], None
    cid = ""
    try:
        if protocol == "messages":
            raw = sv.ant().messages.with_raw_response.create(
                model="m", max_tokens=max_tokens, stream=True, extra_headers=extra,
                messages=[{"role": "user", "content": PROMPT}])
            cid = raw.headers["x-flowtrial-cycle-id"]
            for ev in raw.parse():
                types.append(ev.type)
                if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                    text.append(ev.delta.text)
        elif protocol == "responses":
            raw = sv.oai().responses.with_raw_response.create(
                model="m", input=PROMPT, max_output_tokens=max_tokens, stream=True,
                extra_headers=extra)
            cid = raw.headers["x-flowtrial-cycle-id"]
            for ev in raw.parse():
                types.append(ev.type)
                if ev.type == "response.output_text.delta":
                    text.append(ev.delta)
        elif protocol == "chat":
            raw = sv.oai().chat.completions.with_raw_response.create(
                model="m", max_tokens=max_tokens, stream=True, extra_headers=extra,
                messages=[{"role": "user", "content": PROMPT}])
            cid = raw.headers["x-flowtrial-cycle-id"]
            for chunk in raw.parse():
                types.append("chunk")
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
        else:
            raw = sv.oai().completions.with_raw_response.create(
                model="m", prompt="def stack_push(", max_tokens=max_tokens, stream=True,
                extra_headers=extra)
            cid = raw.headers["x-flowtrial-cycle-id"]
            for chunk in raw.parse():
                types.append("chunk")
                if chunk.choices and chunk.choices[0].text:
                    text.append(chunk.choices[0].text)
    except (openai.APIError, anthropic.APIError) as exc:
        err = exc
        resp = getattr(exc, "response", None)
        if not cid and resp is not None:
            cid = resp.headers.get("x-flowtrial-cycle-id", "")
    return cid, "".join(text), err, types


def whole_call(sv: Served, protocol: str, fault: str = "") -> tuple[str, Any]:
    """One non-streaming request: (cycle id, the parsed answer or the SDK's exception)."""
    extra = {"x-fault": fault} if fault else {}
    try:
        if protocol == "messages":
            raw: Any = sv.ant().messages.with_raw_response.create(
                model="m", max_tokens=20, extra_headers=extra,
                messages=[{"role": "user", "content": PROMPT}])
        elif protocol == "responses":
            raw = sv.oai().responses.with_raw_response.create(
                model="m", input=PROMPT, max_output_tokens=20, extra_headers=extra)
        elif protocol == "chat":
            raw = sv.oai().chat.completions.with_raw_response.create(
                model="m", max_tokens=20, extra_headers=extra,
                messages=[{"role": "user", "content": PROMPT}])
        else:
            raw = sv.oai().completions.with_raw_response.create(
                model="m", prompt="def f(", max_tokens=20, extra_headers=extra)
        return raw.headers["x-flowtrial-cycle-id"], raw.parse()
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        return exc.response.headers.get("x-flowtrial-cycle-id", ""), exc


def assert_still_serving(sv: Served, protocol: str) -> None:
    """A normal request of the same protocol right after the fault succeeds and is recorded."""
    cid, text, err, _ = stream_call(sv, protocol, "", max_tokens=8)
    assert err is None and text, (protocol, err)
    assert sv.row(cid)["status"] == "ok"


# ------------------------------------------------------------------ mid-stream faults
MID_STREAM = {
    "die:5": ("upstream connection failed mid-answer", "upstream_error"),
    "reset:5": ("upstream connection failed mid-answer", "upstream_error"),
    "stall:5": ("upstream timed out mid-answer", "upstream_timeout"),
    "badjson:5": ("malformed event", "upstream_error"),
    "early_end:5": ("without its final event", "upstream_error"),
    "cut_clean:5": ("without its final event", "upstream_error"),
}


@pytest.mark.parametrize("fault", list(MID_STREAM))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mid_stream_fault_gives_partial_stream_then_protocol_error(
        served: Served, protocol: str, fault: str) -> None:
    """The upstream dies (FIN/RST mid-chunk), stalls past the read timeout, sends JSON cut
    short, or ends the body before the final event: the client keeps what it was sent, then
    gets the protocol's error (the SDK raises, or yields Responses' ``error`` event), never
    the final event; the cycle is upstream_error with what was sent."""
    expect, code = MID_STREAM[fault]
    cid, text, err, types = stream_call(served, protocol, fault)
    assert cid.startswith("cyc_")
    if protocol == "responses":
        # The SDK hands the error over as the stream's last event.
        assert err is None and types[-1] == "error", types
        assert "response.completed" not in types and "response.incomplete" not in types
    else:
        assert err is not None and expect in str(err), (types, err)
        if protocol == "messages":
            assert isinstance(err, anthropic.APIStatusError)
            assert "message_stop" not in types
    assert text, "the part sent before the fault reaches the client"
    row = served.row(cid)
    assert (row["status"], row["http_status"]) == ("upstream_error", 200)
    assert expect in row["error"]
    assert row["content_text"] == text and row["tokens_sent"] >= 1
    assert row["experienced_ttft_ms"] >= TARGET_TTFT_MS  # the floor still held
    if fault.startswith("badjson"):
        assert "cut sho" not in row["error"]  # the bad data (maybe content) is not quoted
    assert_still_serving(served, protocol)


def test_raw_error_events_per_protocol(served: Served) -> None:
    """The error that ends a broken stream, as the bytes on the wire: OpenAI's
    ``data: {"error": …}`` (no [DONE]), Responses' ``event: error`` with the next sequence
    number, Anthropic's ``event: error`` with an ``api_error`` / ``timeout_error``."""
    bodies = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
        "responses": ("/v1/responses", {"input": PROMPT}),
        "messages": ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}]}),
    }
    seen: dict[str, list[tuple[str | None, Any]]] = {}
    for name, (path, body) in bodies.items():
        for fault in ("die:5", "stall:5"):
            r = httpx.post(served.url + path, timeout=20, headers={
                "authorization": f"Bearer {served.key}", "x-fault": fault},
                json={"model": "m", "max_tokens": 60, "stream": True, **body})
            assert r.status_code == 200 and "x-flowtrial-cycle-id" in r.headers
            events = []
            for block in r.text.strip().split("\n\n"):
                ev = None
                data = None
                for line in block.split("\n"):
                    if line.startswith("event: "):
                        ev = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                if data is not None:
                    events.append((ev, data if data == "[DONE]" else json.loads(data)))
            seen[f"{name} {fault}"] = events
    for fault, code in (("die:5", "upstream_error"), ("stall:5", "upstream_timeout")):
        chat = seen[f"chat {fault}"]
        assert chat[-1][1]["error"]["code"] == code and all(d != "[DONE]" for _, d in chat)
        resp = seen[f"responses {fault}"]
        last = resp[-1]
        assert last[0] == "error" and last[1]["code"] == code
        assert last[1]["sequence_number"] == resp[-2][1]["sequence_number"] + 1
        msgs = seen[f"messages {fault}"]
        assert msgs[-1][0] == "error" and msgs[-1][1]["type"] == "error"
        assert msgs[-1][1]["error"]["type"] == (
            "timeout_error" if code == "upstream_timeout" else "api_error")


def test_sse_blocks_without_data_are_dropped_comments_pass(served: Served) -> None:
    """SSE blocks without data (a bare ``id:`` or ``retry:``, junk) are no event of these
    protocols, and the openai SDK raises on them: the proxy drops them. Comments (upstream
    keep-alives) pass. The stream completes and is recorded ok."""
    for protocol in PROTOCOLS:
        cid, text, err, _ = stream_call(served, protocol, "noise:4")
        assert err is None and text, (protocol, err)
        assert served.row(cid)["status"] == "ok"
    r = httpx.post(served.url + "/v1/chat/completions", timeout=20, headers={
        "authorization": f"Bearer {served.key}", "x-fault": "noise:4"}, json={
        "model": "m", "max_tokens": 20, "stream": True,
        "messages": [{"role": "user", "content": PROMPT}]})
    assert ": a comment line\n\n" in r.text and r.text.endswith("data: [DONE]\n\n")
    assert "id: 17" not in r.text and "retry:" not in r.text and "junk" not in r.text


# ------------------------------------------------------------------ whole answers
@pytest.mark.parametrize("fault,status,expect", [
    ("die", 502, "upstream connection failed mid-answer"),
    ("reset", 502, "upstream connection failed mid-answer"),
    ("stall", 504, "upstream timed out"),
    ("hang", 504, "upstream timed out"),
    ("badbody", 502, "not a JSON object"),
    ("close", 502, "upstream unreachable"),
    ("not_http", 502, "upstream unreachable"),
])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_non_streaming_fault_is_an_error_status_in_the_protocols_shape(
        served: Served, protocol: str, fault: str, status: int, expect: str) -> None:
    cid, got = whole_call(served, protocol, fault)
    assert isinstance(got, openai.APIStatusError | anthropic.APIStatusError), got
    assert got.status_code == status and expect in str(got)
    body = got.response.json()
    if protocol == "messages":
        assert body["type"] == "error" and body["error"]["type"] in ("api_error",
                                                                     "timeout_error")
    else:
        assert body["error"]["type"] == "upstream_error"
    row = served.row(cid)
    assert (row["status"], row["http_status"]) == ("upstream_error", status)
    assert expect in row["error"] and row["content_text"] in ("", None)
    if fault == "badbody":
        assert "chatcmpl-cut" not in row["error"]
    assert_still_serving(served, protocol)


# ------------------------------------------------------------------ error statuses
@pytest.mark.parametrize("fault,status", [
    ("status:429", 429), ("status:500", 500), ("status:503", 503), ("html:502", 502)])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_upstream_error_status_reaches_the_client_in_its_shape(
        served: Served, protocol: str, fault: str, status: int) -> None:
    """429 and 5xx are forwarded with their status and headers (``retry-after``), in the
    protocol's error shape — an HTML page from a load balancer is wrapped into it."""
    cid, text, err, _ = stream_call(served, protocol, fault)
    assert isinstance(err, openai.APIStatusError | anthropic.APIStatusError), err
    assert err.status_code == status and not text
    if status == 429:
        assert isinstance(err, openai.RateLimitError | anthropic.RateLimitError)
    assert err.response.headers["retry-after"] == "7"
    assert err.response.headers["content-type"].startswith("application/json")
    body = err.response.json()
    message = body["error"]["message"]
    if protocol == "messages":
        assert body["type"] == "error"
    assert ("Bad gateway" in message) if fault.startswith("html") else (
        message == f"scripted {status}")
    row = served.row(cid)
    assert (row["status"], row["http_status"]) == ("upstream_error", status)
    assert ("Bad gateway" in row["error"]) if fault.startswith("html") else (
        row["error"] == f"scripted {status}")
    assert_still_serving(served, protocol)


# ------------------------------------------------------------------ not an event stream
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mislabelled_or_missing_event_stream(served: Served, protocol: str) -> None:
    """An event stream labelled ``text/plain`` is still shaped and recorded as a stream; a
    streaming request answered with a JSON body is a 502 (passed on, the SDK would see an
    empty stream and the answer would go out unshaped)."""
    cid, text, err, _ = stream_call(served, protocol, "ctype:text/plain")
    assert err is None and text
    row = served.row(cid)
    assert row["status"] == "ok" and row["shaped"] and row["tokens_sent"] >= 1
    assert row["experienced_ttft_ms"] >= TARGET_TTFT_MS and row["content_text"] == text

    cid, text, err, _ = stream_call(served, protocol, "json_for_stream")
    assert isinstance(err, openai.APIStatusError | anthropic.APIStatusError), err
    assert err.status_code == 502 and "not an event stream" in str(err)
    row = served.row(cid)
    assert (row["status"], row["http_status"]) == ("upstream_error", 502)


# ------------------------------------------------------------------ nobody there
def test_refused_connection_every_protocol(tmp_path: Path, monkeypatch) -> None:
    """Nothing listens on the upstream port: 502 in each protocol's shape, recorded; the
    WebSocket mode answers a turn with an ``error`` event and keeps the socket."""
    monkeypatch.setenv(KEY_VAR, "sk-x")
    s = upstream_study(tmp_path, f"http://127.0.0.1:{closed_port()}")
    with serve_proxy(s.db, s.config, grace_s=3) as px:
        sv = Served(s, px, None)  # type: ignore[arg-type]
        for protocol in PROTOCOLS:
            cid, got = whole_call(sv, protocol)
            assert isinstance(got, openai.APIStatusError | anthropic.APIStatusError)
            assert got.status_code == 502 and "unreachable" in str(got)
            assert sv.row(cid)["http_status"] == 502

        async def ws_turn() -> dict[str, Any]:
            async with connect(px.base_url.replace("http", "ws") + "/v1/responses",
                               additional_headers={"authorization": f"Bearer {sv.key}"}) as ws:
                await ws.send(json.dumps({"type": "response.create", "model": "m",
                                          "input": "x"}))
                return json.loads(await ws.recv())  # type: ignore[no-any-return]

        ev = asyncio.run(ws_turn())
        assert ev["type"] == "error" and ev["status"] == 502
        assert httpx.get(px.base_url + "/flowtrial/v1/health").json()["status"] == "ok"
    rows = s.rows("SELECT protocol, status, http_status FROM cycles ORDER BY t_request_ns")
    assert [tuple(r) for r in rows] == [(p, "upstream_error", 502) for p in PROTOCOLS] + [
        ("responses", "upstream_error", 502)]


# ------------------------------------------------------------------ WebSocket mode
def test_websocket_turn_faults(served: Served) -> None:
    """Responses WebSocket mode over a real upstream socket: a refused handshake (429 passed
    on, 503 as 502), an upstream that dies mid-turn, stalls, or sends a frame that is not
    JSON — each an ``error`` event on a client socket that stays usable, recorded as
    upstream_error; the next turn on the same client socket is complete and is its own
    answer (the broken upstream connection was dropped, not reused)."""
    url = served.url.replace("http", "ws") + "/v1/responses"
    terminal = {"response.completed", "response.incomplete", "response.failed", "error"}

    async def turn(ws: Any, fault: str = "") -> list[dict[str, Any]]:
        msg = {"type": "response.create", "model": "m", "input": PROMPT,
               "max_output_tokens": 30}
        if fault:
            msg["x_fault"] = fault
        await ws.send(json.dumps(msg))
        events = []
        while True:
            ev = json.loads(await asyncio.wait_for(ws.recv(), 10))
            events.append(ev)
            if ev["type"] in terminal:
                return events

    async def go() -> dict[str, list[dict[str, Any]]]:
        out = {}
        for hs in ("status:429", "status:503"):
            async with connect(url, additional_headers={
                    "authorization": f"Bearer {served.key}", "x-fault": hs}) as ws:
                out[hs] = await turn(ws)
        async with connect(url, additional_headers={
                "authorization": f"Bearer {served.key}"}) as ws:
            for fault in ("die:5", "stall:5", "badjson:5"):
                out[fault] = await turn(ws, fault)
                out[fault + " then"] = await turn(ws)
        return out

    handshakes0 = sum(1 for p, _ in served.up.requests if p.startswith("ws:"))
    got = asyncio.run(go())
    assert (got["status:429"][-1]["status"], got["status:503"][-1]["status"]) == (429, 502)
    expect = {"die:5": (502, "closed mid-answer"), "stall:5": (504, "timed out mid-answer"),
              "badjson:5": (502, "malformed event")}
    for fault, (status, text) in expect.items():
        last = got[fault][-1]
        assert last["type"] == "error" and last["status"] == status
        assert text in last["error"]["message"]
        deltas = [e for e in got[fault] if e["type"] == "response.output_text.delta"]
        assert deltas, (fault, [e["type"] for e in got[fault]])  # the partial answer came
        then = got[fault + " then"]
        assert then[-1]["type"] in ("response.completed", "response.incomplete")
        full = "".join(e["delta"] for e in then if e["type"] == "response.output_text.delta")
        assert full == then[-1]["response"]["output"][0]["content"][0]["text"]
    # A broken upstream connection is never reused: the complete "then" answers above show it
    # (a reused socket would deliver the broken turn's leftover events first). Counting the
    # handshakes instead proved timing-dependent under a loaded CI run (5 of 6 seen once).
    opened = [p for p, _ in served.up.requests if p.startswith("ws:")][handshakes0:]
    assert len(opened) >= 4, served.up.requests[-20:]  # 2 refused + at least 2 re-opens
    rows = served.s.rows("SELECT turn, status, http_status, error FROM cycles WHERE "
                         "transport = 'websocket' ORDER BY t_request_ns")[-8:]
    assert [(r[1], r[2]) for r in rows] == [
        ("upstream_error", 429), ("upstream_error", 502),
        ("upstream_error", 101), ("ok", 101), ("upstream_error", 101), ("ok", 101),
        ("upstream_error", 101), ("ok", 101)]
    assert [r[0] for r in rows[2:]] == [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------ others unaffected
def test_faults_leave_a_concurrent_stream_and_later_requests_untouched(
        served: Served) -> None:
    """While one healthy shaped stream runs (~1-2 s), a burst of every kind of fault hits the
    proxy from other clients: the healthy stream still completes, whole and on its schedule,
    and is recorded ok; afterwards every protocol is served normally."""
    healthy: dict[str, Any] = {}

    def run_healthy() -> None:
        body = {"model": "m", "stream": True, "max_tokens": 300,
                "messages": [{"role": "user", "content": PROMPT}]}
        t0 = time.monotonic()
        with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {served.slow_key}"}) as r:
            healthy["cid"] = r.headers["x-flowtrial-cycle-id"]
            healthy["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        healthy["s"] = time.monotonic() - t0

    calls: list[Callable[[], Any]] = []
    for protocol in PROTOCOLS:
        for fault in ("die:4", "reset:4", "stall:4", "badjson:4", "status:503"):
            calls.append(lambda p=protocol, f=fault: stream_call(served, p, f))
        for fault in ("close", "not_http", "badbody"):
            calls.append(lambda p=protocol, f=fault: whole_call(served, p, f))
    t = threading.Thread(target=run_healthy)
    t.start()
    time.sleep(0.05)
    workers = [threading.Thread(target=c) for c in calls]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    t.join(30)
    assert healthy["lines"][-1] == "data: [DONE]"
    text = "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content") or ""
                   for ln in healthy["lines"][:-1] if json.loads(ln[6:])["choices"])
    row = served.row(healthy["cid"])
    assert row["status"] == "ok" and row["content_text"] == text
    assert row["tokens_sent"] >= 30 and row["experienced_ttft_ms"] >= TARGET_TTFT_MS
    assert SLOW_TPS * 0.8 < row["achieved_tps"] <= SLOW_TPS * 1.02  # paced all along
    assert healthy["s"] > (row["tokens_sent"] - 1) / SLOW_TPS  # so it overlapped the burst
    for protocol in PROTOCOLS:
        assert_still_serving(served, protocol)
    health = httpx.get(served.url + "/flowtrial/v1/health").json()
    assert health["status"] == "ok" and health["open_streams"] == 0
