"""The event API, authentication, request limits and error shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from flowtrial.instrumentation.proxy import serve_proxy

# Recording and reading back are storage paths: run them on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

MODEL = "flowtrial-sim-1"


@pytest.fixture(scope="module")
def served(make_study_module) -> Iterator[tuple]:
    s = make_study_module({"proxy": {"max_body_bytes": 4096}}, participants=("p01", "p02"))
    with serve_proxy(s.db, s.config) as px, httpx.Client(base_url=px.base_url) as http:
        yield s, px, http


def count(s, table: str) -> int:
    return int(s.rows(f"SELECT count(*) FROM {table}")[0][0])


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def a_cycle(px, key: str) -> str:
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key=key, max_retries=0)
    r = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    return r.headers["x-flowtrial-cycle-id"]


def test_valid_batch_is_written(served) -> None:
    s, px, http = served
    cid = a_cycle(px, s.keys["p01"])
    batch = {"events": [
        {"kind": "accept", "cycle_id": cid, "ts": "2026-11-21T10:00:00.250Z"},
        {"kind": "partial_accept", "cycle_id": cid, "payload": {"accepted_chars": 12}},
        {"kind": "focus_out", "ts": 1795000000.5, "duration_s": 12.5,
         "payload": {"app": "Slack", "category": "chat"}},
        {"kind": "custom", "payload": {"note": "café"}},
    ]}
    before = count(s, "events")
    r = http.post("/flowtrial/v1/events", json=batch,
                  headers={"x-api-key": s.keys["p01"]})  # Anthropic-style key header
    assert r.status_code == 200 and r.json() == {"accepted": 4}
    rows = s.rows("SELECT kind, cycle_id, ts_ns, duration_s, payload_json, source, "
                  "participant_id FROM events ORDER BY id")[before:]
    assert [x[0] for x in rows] == ["accept", "partial_accept", "focus_out", "custom"]
    assert rows[0][2] == 1_795_255_200_250_000_000  # 2026-11-21T10:00:00.25Z in epoch ns
    assert rows[2][2] == 1_795_000_000_500_000_000 and rows[2][3] == 12.5
    assert json.loads(rows[3][4]) == {"note": "café"}
    assert {x[5] for x in rows} == {"client"} and {x[6] for x in rows} == {"p01"}


def test_event_for_an_in_flight_cycle_is_accepted(served) -> None:
    """A focus_out during the wait names the cycle being waited for (not yet recorded)."""
    s, px, http = served
    state = px.state
    state.open_cycle("cyc_inflight", "p01")
    try:
        r = http.post("/flowtrial/v1/events", headers=auth(s.keys["p01"]),
                      json={"events": [{"kind": "focus_out", "cycle_id": "cyc_inflight"}]})
    finally:
        state.close_cycle("cyc_inflight")
    assert r.status_code == 200, r.text
    assert s.rows("SELECT cycle_id FROM events ORDER BY id DESC")[0][0] == "cyc_inflight"


def test_other_participants_cycle_is_422_and_nothing_written(served) -> None:
    s, px, http = served
    theirs = a_cycle(px, s.keys["p02"])
    before = count(s, "events")
    batch = {"events": [{"kind": "accept"}, {"kind": "reject", "cycle_id": theirs}]}
    r = http.post("/flowtrial/v1/events", json=batch, headers=auth(s.keys["p01"]))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["param"] == "events[1].cycle_id" and err["code"] == "unknown_cycle"
    r = http.post("/flowtrial/v1/events", headers=auth(s.keys["p01"]),
                  json={"events": [{"kind": "accept", "cycle_id": "cyc_made_up"}]})
    assert r.status_code == 422
    assert count(s, "events") == before


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"events": [{"kind": "teleport"}]}).encode(), 422, "events[0].kind"),
    (json.dumps({"events": [{"kind": "partial_accept"}]}).encode(), 422, "accepted_chars"),
    (json.dumps({"events": [{"kind": "accept", "ts": 12}]}).encode(), 422, "out of range"),
    (json.dumps({"events": [{"kind": "accept", "extra": 1}]}).encode(), 422, "extra"),
    (json.dumps({"events": [{"kind": "accept"}] * 1001}).encode(), 413, "limit"),
])
def test_bad_batches(served, body: bytes, status: int, needle: str) -> None:
    s, px, http = served
    before = count(s, "events")
    r = http.post("/flowtrial/v1/events", content=body, headers=auth(s.keys["p01"]))
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert count(s, "events") == before


def test_more_than_1000_events_is_422(served) -> None:
    s, px, http = served
    before = count(s, "events")
    compact = json.dumps({"events": [{"kind": "accept"}] * 1001}, separators=(",", ":"))
    assert len(compact) > 4096  # over this module's body limit, so parse it directly
    from flowtrial.instrumentation.proxy.events_api import EventsRejected, parse_batch

    with pytest.raises(EventsRejected) as exc:
        parse_batch(compact.encode())
    assert exc.value.status == 422 and "at most 1000" in exc.value.message
    assert count(s, "events") == before


def test_body_too_large_by_header_and_by_stream(served) -> None:
    s, px, http = served
    before = count(s, "cycles")
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]})
    r = http.post("/v1/chat/completions", content=big, headers=auth(s.keys["p01"]))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # chunked upload: no Content-Length to check
        for _ in range(10):
            yield b"x" * 1000

    r = http.post("/v1/chat/completions", content=chunks(), headers=auth(s.keys["p01"]))
    assert r.status_code == 413
    assert count(s, "cycles") == before


def test_auth_errors_in_openai_shape(served) -> None:
    s, px, http = served
    before = count(s, "cycles")
    for headers in ({}, auth("ft_0123456789ab_wrongsecret"), auth("sk-something-else"),
                    {"authorization": "Basic abc"}):
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": []},
                      headers=headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "invalid_api_key"
        assert http.post("/flowtrial/v1/events", json={"events": []},
                         headers=headers).status_code == 401
    c = openai.OpenAI(base_url=px.base_url + "/v1", api_key="ft_nobody_x", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert count(s, "cycles") == before


def test_malformed_json_unknown_path_and_health(served) -> None:
    s, px, http = served
    before = px.state.requests
    r = http.post("/v1/chat/completions", content=b'{"model": ', headers=auth(s.keys["p01"]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = http.post("/v1/chat/completions", content=b"[1, 2]", headers=auth(s.keys["p01"]))
    assert r.status_code == 400
    r = http.post("/v1/embeddings", json={}, headers=auth(s.keys["p01"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    assert http.get("/v1/chat/completions").status_code == 405
    h = http.get("/flowtrial/v1/health")  # no key needed
    assert h.status_code == 200
    body = h.json()
    assert body["status"] == "ok" and body["writer_queue"] >= 0
    assert body["requests"] == before + 2  # the two proxied requests (404/405 never routed)


def test_key_is_verified_once_then_cached(served, monkeypatch) -> None:
    s, px, http = served
    calls = []
    import flowtrial.instrumentation.proxy.auth as auth_mod
    real = auth_mod.participant_by_key
    monkeypatch.setattr(auth_mod, "participant_by_key",
                        lambda db, key: calls.append(key) or real(db, key))
    for _ in range(3):
        r = http.get("/v1/models", headers=auth(s.keys["p02"]))
        assert r.status_code == 200
    assert len(calls) <= 1
