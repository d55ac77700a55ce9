"""Latency shaping through the real proxy: TTFT floor, pace, all-at-once, pass-through,
violations, re-chunking, keep-alives, time scale and the per-design arm lookup."""

from __future__ import annotations

import json
import time
from statistics import median

import httpx
import openai
import pytest

from flowtrial.instrumentation.proxy import create_proxy_app, serve_proxy
from flowtrial.instrumentation.proxy.draw_indices import INDEX_BLOCK
from flowtrial.instrumentation.proxy.shaping import Pacer, Target
from flowtrial.study.schema import Task
from flowtrial.study.storage import utcnow
from tests.instrumentation.proxy_servers import ScriptedUpstream, chat_stream
from tests.instrumentation.servers import run_asgi_server

# Millisecond timing: reruns on a busy machine, the reason logged (tests/conftest.py).
pytestmark = [pytest.mark.usefixtures("fine_gil_switching"), pytest.mark.timing]

MODEL = "flowtrial-sim-1"
MSG = [{"role": "user", "content": "explain python generators with an example"}]
FAST_MOCK = {"mock": {"tokens_per_second": 20000, "ttft_ms": 2}}


# One client for the module: creating an httpx client (its TLS context) costs ~100 ms, which
# would otherwise be counted in the client-side TTFT.
_http = httpx.Client(timeout=30)


def stream_chat(base_url: str, key: str, max_tokens: int, **extra) -> dict:
    """One streaming chat request, timed client-side with raw httpx."""
    body = {"model": MODEL, "messages": MSG, "stream": True, "max_tokens": max_tokens, **extra}
    t0 = time.monotonic()
    first = None
    contents: list[str] = []
    comments = 0
    with _http.stream("POST", base_url + "/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}) as r:
        cid = r.headers["x-flowtrial-cycle-id"]
        for line in r.iter_lines():
            if line.startswith(":"):
                comments += 1
            elif line.startswith("data: {"):
                ch = json.loads(line[6:])
                c = ch["choices"][0]["delta"].get("content") if ch["choices"] else None
                if c:
                    if first is None:
                        first = (time.monotonic() - t0) * 1000
                    contents.append(c)
            elif line == "data: [DONE]":
                done = (time.monotonic() - t0) * 1000
    return {"id": cid, "ttft_ms": first, "contents": contents, "keepalives": comments,
            "total_ms": done}


def row(s, cid: str):
    return s.rows("SELECT * FROM cycles WHERE id = :i", {"i": cid})[0]._mapping


def test_ttft_floor_and_pace(make_study) -> None:
    s = make_study({"arms": [{"name": "shaped", "ttft_ms": 150, "tokens_per_second": 1000}],
                    "upstream": FAST_MOCK})
    with serve_proxy(s.db, s.config) as px:
        stream_chat(px.base_url, s.key, 5)  # warm-up
        got = [stream_chat(px.base_url, s.key, 150) for _ in range(3)]
    rows = [row(s, g["id"]) for g in got]
    # Never early; within a few ms of the floor as the proxy and the client saw it (the
    # median, so one descheduling of the test process on a busy machine does not fail it).
    assert median([r["experienced_ttft_ms"] for r in rows]) < 150 + 5
    assert median([g["ttft_ms"] for g in got]) < 150 + 20
    for g, r in zip(got, rows, strict=True):
        assert r["target_ttft_ms"] == 150 and r["target_tps"] == 1000 and r["shaped"]
        assert 150 <= r["experienced_ttft_ms"] and 150 <= g["ttft_ms"]
        assert r["tokens_sent"] == 150
        # One stream can be a little slower when the machine stalls as its last token is due
        # (149 ms span: 3 ms late is 2 %), so the 2 % bound is on the median.
        assert 0.9 * 1000 <= r["achieved_tps"] <= 1000 * 1.02
        assert r["generation_wait_ms"] >= 150 + 149
    assert median([r["achieved_tps"] for r in rows]) == pytest.approx(1000, rel=0.02)
    assert sum(r["violation"] for r in rows) <= 1


def test_rechunks_into_token_pieces_below_200_tps(make_study) -> None:
    """Per-token delivery (``frame_ms = 0``): an oversized delta is cut into one event per
    token, each its own write (display frames: tests/instrumentation/test_proxy_frames.py)."""
    s = make_study({"arms": [{"name": "slow", "tokens_per_second": 150, "frame_ms": 0}],
                    "upstream": {"mock": {"tokens_per_second": 100000, "ttft_ms": 1}}})
    with serve_proxy(s.db, s.config) as px:
        g = stream_chat(px.base_url, s.key, 30)
    from flowtrial.instrumentation.tokens import split_tokens

    text = "".join(g["contents"])
    assert g["contents"] == split_tokens(text)  # one token per event
    r = row(s, g["id"])
    # Within 5 % on one short stream (193 ms: a 4 ms stall at the last token is 2 %); the
    # 2 % bound over 100+ tokens is benchmarks/bench_proxy_shaping.py's.
    assert r["tokens_sent"] == 30 and 0.95 * 150 <= r["achieved_tps"] <= 150 * 1.02
    assert r["target_ttft_ms"] is None  # rate only: anchored at the first token's arrival
    assert r["frame_ms"] == 0
    assert r["experienced_ttft_ms"] < 50


def test_all_at_once_releases_whole_answer_at_deadline(make_study) -> None:
    s = make_study({"arms": [{"name": "ghost", "ttft_ms": 60, "tokens_per_second": 500,
                              "delivery": "all_at_once"}], "upstream": FAST_MOCK})
    with serve_proxy(s.db, s.config) as px:
        g = stream_chat(px.base_url, s.key, 40, stream_options={"include_usage": True})
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        t0 = time.monotonic()
        whole = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG,
                                                            max_tokens=40)
        client_ms = (time.monotonic() - t0) * 1000
    r = row(s, g["id"])
    due = 60 + 40 / 500 * 1000  # t_request + ttft + n / tps
    assert r["t_first_sent_ns"] == r["t_last_sent_ns"]
    assert due <= r["experienced_ttft_ms"] < due + 15
    assert r["achieved_tps"] is None and r["target_delivery"] == "all_at_once"
    # Non-streaming: held until t_request + ttft + n/tps (n = completion tokens).
    r2 = row(s, whole.headers["x-flowtrial-cycle-id"])
    n = whole.parse().usage.completion_tokens
    assert r2["experienced_ttft_ms"] == pytest.approx(60 + n / 500 * 1000, abs=1)
    assert client_ms >= 60 + n / 500 * 1000


def test_unshaped_arm_passes_through(make_study) -> None:
    s = make_study({"upstream": {"mock": {"tokens_per_second": 2000, "ttft_ms": 30}}})
    with serve_proxy(s.db, s.config) as px:
        stream_chat(px.base_url, s.key, 3)  # warm-up: first key check, first reads
        rows = [row(s, stream_chat(px.base_url, s.key, 40)["id"]) for _ in range(3)]
    for r in rows:
        assert not r["shaped"] and r["target_ttft_ms"] is None and r["target_tps"] is None
        assert not r["violation"] and r["violation_ms"] is None
        assert r["experienced_ttft_ms"] >= 30 and r["achieved_tps"] > 1000
    # The upstream's own TTFT, nothing added.
    assert median([r["experienced_ttft_ms"] for r in rows]) < 30 + 10


def test_slow_upstream_is_a_violation_never_sped_up(make_study) -> None:
    """A fast target over a slow upstream: delivery is never faster than the upstream, and
    the cycle is flagged with the size of the miss."""
    s = make_study({"arms": [{"name": "fast", "ttft_ms": 20, "tokens_per_second": 5000}],
                    "upstream": {"mock": {"tokens_per_second": 400, "ttft_ms": 120}}})
    with serve_proxy(s.db, s.config) as px:
        g = stream_chat(px.base_url, s.key, 40)
    r = row(s, g["id"])
    assert r["experienced_ttft_ms"] >= 120
    assert r["violation"]
    # The miss is the larger of the first token's (≈ 100 ms: the upstream's TTFT against the
    # 20 ms floor) and the last token's (the upstream's 400 tok/s against the 5000 tok/s pace
    # counted from the first token).
    first_miss = r["experienced_ttft_ms"] - 20
    last_miss = r["generation_wait_ms"] - (r["experienced_ttft_ms"] + 39 / 5000 * 1000)
    assert first_miss > 90 and last_miss > 50
    assert r["violation_ms"] == pytest.approx(max(first_miss, last_miss), abs=1)
    assert r["achieved_tps"] < 500  # never faster than the upstream


def test_keepalives_during_long_injected_wait(make_study) -> None:
    s = make_study({"arms": [{"name": "slow", "ttft_ms": 400}], "upstream": FAST_MOCK,
                    "proxy": {"keepalive_s": 0.1}})
    with serve_proxy(s.db, s.config) as px:
        g = stream_chat(px.base_url, s.key, 5)
        c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=s.key, max_retries=0)
        text = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=5)
    assert 3 <= g["keepalives"] <= 4  # every 100 ms of the 400 ms wait
    assert g["contents"] and text.choices[0].message.content  # whitespace keep-alives are
    r = row(s, g["id"])  # valid JSON padding for the non-streaming body
    assert 400 <= r["experienced_ttft_ms"] < 415


def test_time_scale_compresses_injected_latency(make_study) -> None:
    s = make_study({"study": {"time_scale": 10},
                    "arms": [{"name": "slow", "ttft_ms": 2000, "tokens_per_second": 50}],
                    "upstream": FAST_MOCK})
    # 60 tokens: at the compressed 500 tokens/s a 20-token stream lasts 38 ms, and one
    # machine stall of ~1 ms on its last token was already the 3 % bound (seen in CI).
    with serve_proxy(s.db, s.config) as px:
        rows = [row(s, stream_chat(px.base_url, s.key, 60)["id"]) for _ in range(3)]
    for r in rows:
        assert r["target_ttft_ms"] == 200 and r["target_tps"] == 500  # applied (raw) targets
        assert r["experienced_ttft_ms"] >= 200
    assert median([r["experienced_ttft_ms"] for r in rows]) < 205
    assert median([r["achieved_tps"] for r in rows]) == pytest.approx(500, rel=0.03)


def test_per_prompt_draws_continue_across_restarts(make_study) -> None:
    s = make_study({"study": {"design": "per_prompt", "seed": 7},
                    "per_prompt": {"ttft_ms": {"min": 20, "max": 60},
                                   "tokens_per_second": {"min": 2000, "max": 4000}},
                    "arms": [], "upstream": FAST_MOCK})
    from flowtrial.study.randomization import per_prompt_draw

    ids = []
    for _ in range(2):  # two proxy lifetimes on the same database
        with serve_proxy(s.db, s.config) as px:
            ids += [stream_chat(px.base_url, s.key, 5)["id"] for _ in range(2)]
    draws = [json.loads(row(s, i)["draw_json"]) for i in ids]
    # The second lifetime continues past the block of indices the first one claimed.
    assert [d["request_index"] for d in draws] == [0, 1, INDEX_BLOCK, INDEX_BLOCK + 1]
    for cid, d in zip(ids, draws, strict=True):
        expected = per_prompt_draw(s.config.per_prompt, 7, "p01", d["request_index"])
        assert d["ttft_ms"] == pytest.approx(expected["ttft_ms"])
        r = row(s, cid)
        assert r["arm"] == "per_prompt" and r["target_ttft_ms"] == pytest.approx(d["ttft_ms"])
        assert r["experienced_ttft_ms"] >= d["ttft_ms"]


def test_crossover_arm_follows_the_started_task(make_study) -> None:
    s = make_study({"study": {"design": "crossover"},
                    "arms": [{"name": "a", "ttft_ms": 10}, {"name": "b", "ttft_ms": 20}],
                    "upstream": FAST_MOCK})
    periods = {r[0]: r[1] for r in s.rows(
        "SELECT period, arm FROM assignments WHERE participant_id = 'p01'")}
    with serve_proxy(s.db, s.config) as px:
        first = stream_chat(px.base_url, s.key, 3)["id"]
        with s.database.session() as session:
            session.add(Task(participant_id="p01", name="t1", period=1, status="started",
                             started_at_ns=time.time_ns(), created_at=utcnow()))
            session.commit()
        second = stream_chat(px.base_url, s.key, 3)["id"]
    r1, r2 = row(s, first), row(s, second)
    assert (r1["arm"], r1["period"], r1["task_id"]) == (periods[0], 0, None)
    assert (r2["arm"], r2["period"]) == (periods[1], 1) and r2["task_id"] is not None
    assert r2["target_ttft_ms"] == {"a": 10, "b": 20}[periods[1]]


@pytest.mark.parametrize("design", ["parallel", "per_prompt"])
def test_cycles_are_labelled_with_the_started_task(make_study, design: str) -> None:
    """Outside crossover the task is read alongside the upstream call, not before it: the
    label must still be the task started when the request came in."""
    extra = {"per_prompt": {"ttft_ms": {"min": 5, "max": 10}}} if design == "per_prompt" else {}
    s = make_study({"study": {"design": design}, "upstream": FAST_MOCK, **extra})
    with serve_proxy(s.db, s.config) as px:
        before = stream_chat(px.base_url, s.key, 3)["id"]
        with s.database.session() as session:
            task = Task(participant_id="p01", name="t1", status="started",
                        started_at_ns=time.time_ns(), created_at=utcnow())
            session.add(task)
            session.commit()
            tid = task.id
        during = [stream_chat(px.base_url, s.key, 3)["id"] for _ in range(3)]
    assert row(s, before)["task_id"] is None
    assert [row(s, c)["task_id"] for c in during] == [tid] * 3


def test_pacer_jitter_preserves_mean_gap() -> None:
    p = Pacer(Target(ttft_ms=100, tokens_per_second=100, jitter=0.5), 0, seed="x")
    n = 20000
    assert p.due(0) == 100_000_000
    mean_gap = (p.due(n) - p.due(0)) / n
    assert mean_gap == pytest.approx(1e7, rel=0.02)
    gaps = [p.due(k + 1) - p.due(k) for k in range(1000)]
    assert min(gaps) < 0.6e7 < 1.6e7 < max(gaps)  # jittered, not constant
    assert Pacer(Target(ttft_ms=5, tokens_per_second=10), 0).due_all(20) == 5_000_000 + 2 * 10**9


def test_scripted_stall_mid_stream_is_paced_from_arrival(make_study) -> None:
    """A stall the schedule catches up on is not a violation; a late end is."""
    s = make_study({"arms": [{"name": "p", "ttft_ms": 30, "tokens_per_second": 100}]})
    chunks = [(0, c) for c in chat_stream(["a", " b", " c"])]
    chunks[3] = (0.3, chunks[3][1])  # " c" arrives 300 ms late: long after its due time
    app = create_proxy_app(s.database, s.config, upstream=ScriptedUpstream(chunks))
    with run_asgi_server(app) as url:
        g = stream_chat(url, s.key, 3)
    r = row(s, g["id"])
    assert r["violation"] and r["violation_ms"] > 200  # the last token was ~280 ms late
    assert 30 <= r["experienced_ttft_ms"] < 45


def test_release_spin_is_never_early_and_lets_other_tasks_run() -> None:
    """The first-token release yields to the loop while it spins: other streams are not
    starved, and the deadline is never undercut (uvloop timers fire early)."""
    import asyncio

    import uvloop

    from flowtrial.instrumentation.proxy.shaping import RELEASE_SPIN_NS, sleep_until

    async def main() -> tuple[list[int], int]:
        ticks = 0
        stop = False

        async def other() -> None:  # another stream's work during the spin
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(other())
        early = []
        for i in range(40):
            deadline = time.monotonic_ns() + RELEASE_SPIN_NS + 300_000 * (i % 5)
            await sleep_until(deadline, RELEASE_SPIN_NS)
            early.append(deadline - time.monotonic_ns())
        stop = True
        await t
        return early, ticks

    early, ticks = uvloop.run(main())
    assert max(early) <= 0
    assert ticks > 40  # the other task ran many times while the releases spun
