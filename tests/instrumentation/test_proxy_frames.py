"""Display-frame delivery for fast arms (issue 21): at 1,000 tokens/s the tokens due within
one frame (``frame_ms``, 8 ms by default) leave together in one write, each upstream event
still its own protocol event, on absolute deadlines; token 0 is still the precise release.

The strategy itself with a recording transport (writes counted, deadlines checked), then a
1,000 tokens/s arm on every protocol with the official SDKs against the simulated model
served over HTTP: the SDK's reassembled text equals the model's own answer, the achieved
rate is close to the target, and the row records the granularity used.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import anthropic
import openai
import pytest

from flowtrial.instrumentation.mock_model import MockModel
from flowtrial.instrumentation.mock_model.app import create_mock_app
from flowtrial.instrumentation.proxy import serve_proxy
from flowtrial.instrumentation.proxy.delivery import Framed, Output, Paced, delivery_for
from flowtrial.instrumentation.proxy.protocols.base import SSEEvent
from flowtrial.instrumentation.proxy.protocols.chat import ChatAdapter
from flowtrial.instrumentation.proxy.recorder import CycleRecord
from flowtrial.instrumentation.proxy.shaping import Pacer, Target
from flowtrial.instrumentation.tokens import split_tokens
from flowtrial.study.config import DEFAULT_FRAME_MS
from tests.instrumentation.proxy_servers import chat_chunk, on_time
from tests.instrumentation.servers import run_asgi_server

pytestmark = pytest.mark.usefixtures("fine_gil_switching")
MODEL = "flowtrial-sim-1"
ASK = "explain python generators with an example"
TPS = 1000.0


class Recording:
    """A transport that notes every write: when, and the SSE events it carried."""

    keepalive_frames = True

    def __init__(self) -> None:
        self.writes: list[tuple[int, list[bytes]]] = []

    async def emit(self, frames: list[bytes]) -> None:
        self.writes.append((time.monotonic_ns(), list(frames)))

    async def emit_keepalive(self) -> None:
        pass

    async def emit_last(self, frame: bytes) -> None:
        pass

    def client_key(self) -> str | None:
        return None


def _record(t0: int) -> CycleRecord:
    return CycleRecord(id="cyc_x", participant_id="p", protocol="chat", stream=True,
                       model="m", upstream="", mono_anchor_ns=t0, wall_anchor_ns=0,
                       t_request_ns=t0, started_at=datetime.now(UTC))


def _relay(target: Target, events: list[str]) -> tuple[Recording, CycleRecord, Pacer]:
    """Feed one-token text events (all already arrived) to the arm's strategy."""
    t0 = time.monotonic_ns()
    tr, rec, adapter = Recording(), _record(t0), ChatAdapter()
    pacer = Pacer(target, t0)
    out = Output(tr, rec, 5 * 10**9)
    delivery = delivery_for(pacer, out, adapter)

    async def go() -> None:
        for text in events:
            raw = chat_chunk({"content": text})
            ev = SSEEvent(raw, None, raw[6:].strip().decode())
            await delivery.content(ev, adapter.classify(ev), t0)
        await delivery.pause()
        await delivery.finish()
        if out.frames:
            await out.flush()

    asyncio.run(go())
    return tr, rec, pacer


@pytest.mark.timing
@pytest.mark.parametrize("jitter", [0.0, 0.5])
def test_tokens_due_within_a_frame_leave_in_one_write(jitter: float) -> None:
    words = [" one", " two", " three", " four"] * 50
    assert split_tokens("".join(words)) == words  # one token each
    tr, rec, pacer = _relay(Target(ttft_ms=20, tokens_per_second=TPS, jitter=jitter,
                                   frame_ms=8), words)
    assert pacer.frame_ns == 8_000_000 and rec.frame_ms == 8
    sent = [ev for _, evs in tr.writes for ev in evs]
    # Every upstream event is still its own event, in order, none merged or cut.
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in sent] == words
    # Token 0 alone, precisely at the floor; then one write per frame (~8 tokens), not 199.
    t_first, first = tr.writes[0]
    assert len(first) == 1 and t_first >= rec.t_request_ns + 20_000_000
    span_frames = pacer.offset(199) / 8e6
    # Each frame spans < 8 ms plus the gap to the next frame's first token.
    assert 0.7 * span_frames <= len(tr.writes) - 1 <= span_frames * (1 + 2 * jitter) + 6
    k = 1
    for t, evs in tr.writes[1:]:
        last = pacer.due(k + len(evs) - 1)
        # Never before the frame's last token is due; its tokens due within one frame.
        assert t >= last and last - pacer.due(k) < 8_000_000
        k += len(evs)
    # The answer's last token on its absolute deadline: the pace is exact over the answer.
    assert rec.t_last_sent_ns - rec.t_first_sent_ns == pytest.approx(pacer.offset(199),
                                                                     rel=0.02)


def test_one_big_event_is_split_only_where_it_spans_frames() -> None:
    text = "".join([" one", " two", " three", " four"] * 25)
    tr, _, _ = _relay(Target(ttft_ms=0, tokens_per_second=TPS, frame_ms=8), [text])
    parts = [json.loads(e[6:])["choices"][0]["delta"]["content"]
             for _, evs in tr.writes for e in evs]
    assert "".join(parts) == text
    # Token 0, then one part per frame (each whole tokens), one write each.
    assert len(split_tokens(parts[0])) == 1 and all(len(evs) == 1 for _, evs in tr.writes)
    assert 99 / 8 <= len(parts) - 1 <= 99 / 8 + 2


def test_slow_arms_and_frame_ms_0_keep_one_write_per_token() -> None:
    for target in (Target(ttft_ms=0, tokens_per_second=50),  # 20 ms gap > 8 ms frame
                   Target(ttft_ms=0, tokens_per_second=TPS, frame_ms=0)):
        pacer = Pacer(target, 0)
        assert pacer.frame_ns == 0
        d = delivery_for(pacer, Output(Recording(), _record(0), 10**9), ChatAdapter())
        assert type(d) is Paced and d.out.rec.frame_ms == 0
    fast = Pacer(Target(tokens_per_second=TPS, frame_ms=DEFAULT_FRAME_MS), 0)
    assert type(delivery_for(fast, Output(Recording(), _record(0), 10**9), ChatAdapter())
                ) is Framed


# ---------------------------------------------------------------- every protocol, SDKs


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    """A 1,000 tokens/s arm (default frame) over the simulated model served over HTTP; the
    model's own URL is kept to ask it for the reference answers."""
    mock = create_mock_app(MockModel(tokens_per_second=20000, ttft_ms=2))
    with run_asgi_server(mock) as up:
        mp = pytest.MonkeyPatch()
        mp.setenv("FT_TEST_UPSTREAM_KEY", "sk-upstream-test")
        s = make_study_module({
            "capture": {"content": "full"},
            "upstream": {"openai": {"base_url": up + "/v1",
                                    "api_key_env": "FT_TEST_UPSTREAM_KEY"},
                         "anthropic": {"base_url": up, "api_key_env": "FT_TEST_UPSTREAM_KEY"}},
            "arms": [{"name": "spark", "ttft_ms": 100, "tokens_per_second": TPS}]})
        try:
            with serve_proxy(s.db, s.config) as px:
                yield s, px, up
        finally:
            mp.undo()


def _row(s: Any) -> Any:
    return s.rows("SELECT * FROM cycles ORDER BY t_request_ns DESC LIMIT 1")[0]._mapping


def _check(s: Any, text: str, reference: str) -> None:
    assert text == reference and len(split_tokens(text)) >= 50
    row = _row(s)
    assert row["status"] == "ok" and row["content_text"] == text
    assert row["frame_ms"] == DEFAULT_FRAME_MS and row["target_tps"] == TPS
    assert row["experienced_ttft_ms"] >= 100 and on_time(row)


def _check_rate(s: Any) -> None:
    assert _row(s)["achieved_tps"] == pytest.approx(TPS, rel=0.05)


def _oa(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


@pytest.mark.timing
def test_chat_at_1000_tps(served) -> None:
    s, px, up = served
    msgs = [{"role": "user", "content": ASK}]

    def text(c: openai.OpenAI) -> str:
        return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model=MODEL, messages=msgs, stream=True, max_tokens=400) if ch.choices)

    _check(s, text(_oa(px.base_url, s.key)), text(_oa(up, "sk-upstream-test")))
    _check_rate(s)


@pytest.mark.timing
def test_completions_at_1000_tps(served) -> None:
    s, px, up = served

    def text(c: openai.OpenAI) -> str:
        return "".join(ch.choices[0].text for ch in c.completions.create(
            model=MODEL, prompt="def fibonacci(n):", stream=True, max_tokens=400)
            if ch.choices)

    _check(s, text(_oa(px.base_url, s.key)), text(_oa(up, "sk-upstream-test")))
    _check_rate(s)


@pytest.mark.timing
def test_messages_at_1000_tps(served) -> None:
    s, px, up = served

    def text(url: str, key: str) -> str:
        c = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        with c.messages.stream(model=MODEL, max_tokens=400,
                               messages=[{"role": "user", "content": ASK}]) as st:
            return st.get_final_text()

    _check(s, text(px.base_url, s.key), text(up, "sk-upstream-test"))
    _check_rate(s)


@pytest.mark.timing
def test_responses_at_1000_tps(served) -> None:
    s, px, up = served

    def text(c: openai.OpenAI) -> str:
        with c.responses.stream(model=MODEL, input=ASK, max_output_tokens=400) as st:
            deltas = [e.delta for e in st if e.type == "response.output_text.delta"]
        return "".join(deltas)

    _check(s, text(_oa(px.base_url, s.key)), text(_oa(up, "sk-upstream-test")))
    _check_rate(s)


@pytest.mark.timing
def test_responses_websocket_at_1000_tps(served) -> None:
    s, px, up = served

    def text(c: openai.OpenAI) -> str:
        with c.responses.connect() as conn:
            conn.response.create(model=MODEL, input=ASK, max_output_tokens=400)
            deltas = []
            for e in conn:
                if e.type == "response.output_text.delta":
                    deltas.append(e.delta)
                elif e.type in ("response.completed", "response.incomplete", "error"):
                    assert e.type != "error", e
                    break
        return "".join(deltas)

    _check(s, text(_oa(px.base_url, s.key)), text(_oa(up, "sk-upstream-test")))
    assert _row(s)["transport"] == "websocket"
    _check_rate(s)
