"""Property-based fuzzing of every proxy endpoint, in-process (the real app, its writer and the
in-process simulated model): random bytes, random and protocol-shaped JSON, deeply nested and
oversized bodies, wrong content types and methods, random WebSocket messages and random
participant-page forms.

What must hold for every request:

- never a 5xx, and every error in the protocol's own shape (OpenAI ``{"error": {...}}``,
  Anthropic ``{"type": "error", "error": {...}}`` on the Messages paths);
- what the proxy itself refuses (no or unknown key, not a JSON object, too large) is refused
  with exactly that status and writes nothing;
- no row without a receipt: the cycles table gains a row only for a response that carries
  its ``x-flowtrial-cycle-id`` (one row, that id, the status the client got) — a JSON object
  the proxy forwards is a cycle even when the upstream refuses it (recorded as ``error``);
  the events table gains exactly the ``accepted`` count of a 200 from the event API or the
  Continue endpoint, and nothing otherwise;
- another participant's cycle or task is never written to.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from flowtrial.instrumentation.continue_data import CONTINUE_PATH
from flowtrial.instrumentation.participant_page import PREFIX
from flowtrial.study.tasks import add_task
from tests.security.conftest import Study, bearer, login, make_study, proxy_client

LIMIT = 64 * 1024
SETTINGS = settings(max_examples=40, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
PROTOCOL_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                  "/v1/messages/count_tokens")
ALL_POST_PATHS = (*PROTOCOL_PATHS, "/flowtrial/v1/events", CONTINUE_PATH)
CHAT = {"model": "flowtrial-sim-1", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Study, TestClient,
                                                                         dict[str, Any]]]:
    study = make_study(tmp_path_factory.mktemp("fuzz"), {"proxy": {"max_body_bytes": LIMIT}},
                       participants=("alice", "bob"))
    with proxy_client(study) as client:
        ids = {}
        for pid in ("alice", "bob"):
            r = client.post("/v1/chat/completions", json=CHAT, headers=bearer(study.keys[pid]))
            assert r.status_code == 200
            ids[f"{pid}_cycle"] = r.headers["x-flowtrial-cycle-id"]
        ids["bob_task"] = add_task(study.database, "bob", "bob's task")
        ids["alice_task"] = add_task(study.database, "alice", "alice's task")
        yield study, client, ids
    study.database.dispose()


# ------------------------------------------------------------------ strategies

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                           max_leaves=25)
models = st.sampled_from(["flowtrial-sim-1", "", "gpt-4o", "claude-x"]) | json_values
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer"]) | scalars},
    optional={"content": st.text(max_size=60) | json_values, "name": json_values}),
    max_size=3) | json_values
protocol_objects = st.fixed_dictionaries({}, optional={
    "model": models, "messages": messages, "prompt": st.text(max_size=60) | json_values,
    "input": st.text(max_size=60) | messages, "suffix": json_values,
    "stream": st.booleans() | scalars, "max_tokens": st.integers(-5, 64) | scalars,
    "max_output_tokens": st.integers(-5, 64) | scalars, "n": st.integers(-1, 3) | scalars,
    "stream_options": st.just({"include_usage": True}) | json_values,
    "tools": json_values, "system": json_values, "stop": json_values,
    "temperature": scalars, "previous_response_id": scalars,
}).map(lambda d: {**d, **({"max_tokens": 8} if d.get("max_tokens") is None else {})})


def _event(cycles: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    kinds = st.sampled_from(["accept", "reject", "partial_accept", "edit", "focus_out",
                             "focus_in", "task_start", "custom"]) | scalars
    ts = st.none() | st.floats(9e8, 5e9) | st.sampled_from(
        ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05", "9999-12-31T00:00:00", "1970-01-01",
         "not a time"]) | scalars
    payload = st.none() | st.dictionaries(
        st.sampled_from(["app", "category", "accepted_chars", "accepted_fraction", "title",
                         "x"]), scalars | json_values, max_size=3) | json_values
    return st.fixed_dictionaries({"kind": kinds}, optional={
        "ts": ts, "cycle_id": st.sampled_from(cycles) | st.none() | st.text(max_size=140),
        "duration_s": st.none() | st.floats(-1, 1e6) | scalars, "payload": payload,
        "extra": scalars})


def _nested(depth: int, obj: bool) -> bytes:
    if obj:
        return (b'{"a":' * depth) + b"1" + (b"}" * depth)
    return b"[" * depth + b"]" * depth


def _deep_inside(depth: int, shaped: Any) -> bytes:
    """A plausible object with one field nested ``depth`` levels deep."""
    obj = shaped if isinstance(shaped, dict) else {"x": shaped}
    raw = json.dumps({**obj, "deep": 0}).encode()
    return raw.replace(b'"deep": 0', b'"deep": ' + _nested(depth, False))


def bodies(shaped: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Request bodies of every kind; ``shaped``: plausible objects for the endpoint."""
    return st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        shaped.map(lambda v: json.dumps(v).encode()),
        shaped.map(lambda v: json.dumps(v).encode()),
        st.tuples(st.integers(1, 5000), st.booleans()).map(lambda a: _nested(*a)),
        st.tuples(st.integers(1, 3000), shaped).map(lambda a: _deep_inside(*a)),
        st.integers(LIMIT - 20, LIMIT + 200).map(
            lambda n: b'{"model": "' + b"a" * n + b'"}'),
        st.sampled_from([b"", b"null", b"{}", b"[]", b'"x"', b"{", b"\xff\xfe", b"NaN",
                         b'{"model": NaN}', b"\x00" * 10]),
    )


content_types = st.sampled_from([None, "application/json", "text/plain",
                                 "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=zz", "application/json; "
                                 "charset=latin-1", "garbage/garbage", ""])


# ------------------------------------------------------------------ checks


def error_shape(path: str, r: Any) -> None:
    """The protocol's own error shape, with a message that says something."""
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error", body
        err = body["error"]
        assert isinstance(err["type"], str)
    else:
        err = body["error"]
        assert isinstance(err["type"], str) and "code" in err
    assert isinstance(err["message"], str) and len(err["message"]) > 10


def expected_refusal(body: bytes, not_object: int = 400) -> set[int] | None:
    """The statuses the proxy itself may answer without forwarding, if any (None: it is a
    JSON object; the proxy may forward it, or refuse it as nested too deeply to read).
    ``not_object``: the status for JSON that is not an object (the event API and Continue
    treat it as a body of the wrong shape, 422).

    How deep a body the proxy can read depends on its thread's free stack (Hypothesis raises
    the interpreter's recursion limit while it runs, and this thread is deeper than the
    app's), so for a body this thread cannot read for depth the proxy may instead read it:
    then it is judged by its shape."""
    if len(body) > LIMIT:
        return {413}
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {400}
    except RecursionError:
        # Too deep for this thread: "nested too deeply" (400), or what its shape earns.
        return {400, not_object} if body.lstrip()[:1] == b"[" else None
    if isinstance(obj, dict):
        return None
    # Uploads are read in an ingest process, whose recursion limit is not Hypothesis's.
    return {400, not_object} if _depth(obj) > 900 else {not_object}


def _depth(value: Any) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def headers_for(key: str | None, ctype: str | None) -> dict[str, str]:
    h = bearer(key) if key else {}
    if ctype is not None:
        h["content-type"] = ctype
    return h


def check_rows(study: Study, before: dict[str, int], r: Any, path: str) -> None:
    after = study.counts()
    cid = r.headers.get("x-flowtrial-cycle-id")
    if path in PROTOCOL_PATHS and path != "/v1/messages/count_tokens" and cid:
        assert after["cycles"] == before["cycles"] + 1, "one cycle per receipt"
        row = study.rows("SELECT participant_id, http_status, status FROM cycles "
                         "WHERE id = :i", {"i": cid})
        assert row, f"the receipt {cid} names no recorded cycle"
        pid, http_status, status = row[0]
        assert pid == "alice" and http_status == r.status_code
        assert (status == "ok") == (r.status_code < 400), (status, r.status_code)
    else:
        assert cid is None, f"{path} handed out a cycle id"
        assert after["cycles"] == before["cycles"], f"{path} wrote a cycle without a receipt"
    accepted = 0
    if path in ("/flowtrial/v1/events", CONTINUE_PATH) and r.status_code == 200:
        accepted = r.json()["accepted"]
    # A re-sent Continue payload adds nothing and says so (accepted 0, duplicates 1).
    assert after["events"] == before["events"] + accepted
    untouched = ("tasks", "questionnaire_answers", "participants", "assignments",
                 "persistence")
    assert {t: after[t] for t in untouched} == {t: before[t] for t in untouched}


# ------------------------------------------------------------------ HTTP endpoints


@pytest.mark.parametrize("path", PROTOCOL_PATHS)
@SETTINGS
@given(body=bodies(protocol_objects), ctype=content_types)
def test_protocol_endpoints_survive_any_body(served: Any, path: str, body: bytes,
                                             ctype: str | None) -> None:
    study, client, _ = served
    before = study.counts()
    r = client.post(path, content=body, headers=headers_for(study.keys["alice"], ctype))
    assert r.status_code < 500, (r.status_code, r.text[:300])
    refusal = expected_refusal(body)
    if refusal is not None:
        assert r.status_code in refusal, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        error_shape(path, r)
    check_rows(study, before, r, path)


@SETTINGS
@given(data=st.data(), ctype=content_types)
def test_event_api_survives_any_body(served: Any, data: st.DataObject,
                                     ctype: str | None) -> None:
    study, client, ids = served
    cycles = [ids["alice_cycle"], ids["bob_cycle"], "cyc_unknown"]
    batches = st.fixed_dictionaries({"events": st.lists(_event(cycles), max_size=5)},
                                    optional={"extra": scalars}) | json_values
    body = data.draw(bodies(batches))
    before = study.counts()
    r = client.post("/flowtrial/v1/events", content=body,
                    headers=headers_for(study.keys["alice"], ctype))
    assert r.status_code in (200, 400, 413, 422), (r.status_code, r.text[:300])
    refusal = expected_refusal(body, 422)
    if refusal is not None:
        assert r.status_code in refusal, (r.status_code, r.text[:300])
    if r.status_code != 200:
        error_shape("/flowtrial/v1/events", r)
    elif refusal is None:
        named = {e.get("cycle_id") for e in json.loads(body)["events"]}
        assert ids["bob_cycle"] not in named and "cyc_unknown" not in named
    check_rows(study, before, r, "/flowtrial/v1/events")
    assert study.rows("SELECT COUNT(*) FROM events WHERE participant_id = 'bob' OR "
                      "cycle_id = :c", {"c": ids["bob_cycle"]})[0][0] == 0


@SETTINGS
@given(data=st.data(), ctype=content_types)
def test_continue_endpoint_survives_any_body(served: Any, data: st.DataObject,
                                             ctype: str | None) -> None:
    study, client, ids = served
    payloads = st.fixed_dictionaries({"name": st.sampled_from(
        ["autocomplete", "nextEditOutcome", "editOutcome", "chatInteraction", "other"])
        | scalars}, optional={"data": st.fixed_dictionaries({}, optional={
            "accepted": st.booleans() | scalars,
            "completionId": st.sampled_from([ids["alice_cycle"], ids["bob_cycle"]]) | scalars,
            "completion": st.text(max_size=80) | scalars, "newCode": st.text(max_size=80),
            "modelName": scalars, "lineChange": scalars}) | json_values,
            "schema": scalars, "level": st.sampled_from(["all", "noCode"]) | scalars})
    body = data.draw(bodies(payloads))
    before = study.counts()
    r = client.post(CONTINUE_PATH, content=body, headers=headers_for(study.keys["alice"], ctype))
    assert r.status_code in (200, 400, 413, 422), (r.status_code, r.text[:300])
    refusal = expected_refusal(body, 422)
    if refusal is not None:
        assert r.status_code in refusal, (r.status_code, r.text[:300])
    if r.status_code != 200:
        error_shape(CONTINUE_PATH, r)
    else:
        assert r.json().get("cycle_id") in (None, ids["alice_cycle"])
    check_rows(study, before, r, CONTINUE_PATH)
    assert study.rows("SELECT COUNT(*) FROM events WHERE participant_id = 'bob' OR "
                      "cycle_id = :c", {"c": ids["bob_cycle"]})[0][0] == 0


auth_headers = st.one_of(
    st.just({}),
    st.builds(lambda v: {"authorization": v}, st.sampled_from(
        ["Bearer", "Bearer ", "Basic abc", "bearer ft_", "Bearer ft_abc_def", "Bearer ft__x",
         "Bearer ft_x_", "ft_abc_def"]) | st.text(st.characters(codec="ascii",
                                                                 min_codepoint=32),
                                                  max_size=40).map(lambda s: "Bearer " + s)),
    st.builds(lambda v: {"x-api-key": v}, st.text(st.characters(codec="ascii",
                                                                min_codepoint=33),
                                                   min_size=1, max_size=40)),
)


@SETTINGS
@given(path=st.sampled_from(ALL_POST_PATHS), headers=auth_headers,
       body=st.sampled_from([json.dumps(CHAT).encode(), b'{"events": []}', b"{}", b"x"]))
def test_unknown_keys_are_refused_everywhere_and_write_nothing(
        served: Any, path: str, headers: dict[str, str], body: bytes) -> None:
    study, client, ids = served
    key_id = study.keys["alice"].split("_")[1]
    headers = {k: v.replace("abc", key_id) for k, v in headers.items()}  # real id, bad secret
    before = study.counts()
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == 401, (path, headers, r.status_code)
    error_shape(path, r)
    assert study.counts() == before
    for get in ("/v1/models", "/flowtrial/v1/admin/status"):
        assert client.get(get, headers=headers).status_code in (401, 403)


@SETTINGS
@given(method=st.sampled_from(["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]),
       path=st.sampled_from([*ALL_POST_PATHS, "/v1/models", "/flowtrial/v1/health", "/"])
       | st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="?#%"),
                 max_size=30).map(lambda s: "/" + s))
def test_other_methods_and_paths_are_clean_4xx(served: Any, method: str, path: str) -> None:
    study, client, _ = served
    before = study.counts()
    r = client.request(method, path, headers=bearer(study.keys["alice"]))
    assert r.status_code < 500, (method, path, r.status_code)
    if r.status_code >= 400 and not path.startswith(PREFIX):
        error_shape(path, r)
    assert study.counts() == before


# ------------------------------------------------------------------ WebSocket mode


ws_messages = st.one_of(
    json_values.map(json.dumps),
    st.text(max_size=200),
    st.fixed_dictionaries({"type": st.sampled_from(["response.cancel", "session.update",
                                                    "", "response"]) | scalars},
                          optional={"model": models, "input": messages}).map(json.dumps),
    st.integers(1, 3000).map(lambda n: '{"type": "response.create", "input": '
                             + "[" * n + "]" * n + "}"),
    st.integers(LIMIT + 1, LIMIT + 100).map(lambda n: json.dumps({"type": "response.create",
                                                                  "input": "x" * n})),
)


WS_END = ("response.completed", "response.incomplete", "response.failed", "error")
# Refusals of the proxy itself (before any turn): they never make a cycle.
WS_OWN_CODES = ("invalid_json", "unsupported_type", "request_too_large")


def next_message(ws: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The proxy's next WebSocket message as JSON, or a failure after ``timeout`` s: a message
    left unanswered must fail its example (so Hypothesis reports it), not hang the suite
    (TestClient's ``receive_text`` waits forever, out of pytest-timeout's reach)."""

    async def within() -> Any:
        with anyio.fail_after(timeout):
            return await ws._send_rx.receive()

    try:
        message = ws.portal.call(within)
    except TimeoutError:
        pytest.fail(f"no WebSocket message from the proxy within {timeout:g} s")
    ws._raise_on_close(message)
    return dict(json.loads(message["text"]))


def settle(client: TestClient, timeout: float = 10.0) -> None:
    """Wait until no cycle is in flight (each turn closes its cycle once it is recorded)."""
    state = client.app.state.proxy  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while state.open_cycles:
        assert time.monotonic() < deadline, "a turn never finished"
        time.sleep(0.002)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(ws_messages, min_size=1, max_size=8))
def test_websocket_refuses_bad_messages_and_stays_usable(served: Any, batch: list[str]) -> None:
    study, client, _ = served
    with client.websocket_connect("/v1/responses",
                                  headers=bearer(study.keys["alice"])) as ws:
        for raw in batch:
            before = study.counts()
            ws.send_text(raw)
            msg = next_message(ws)
            while msg.get("type") not in WS_END:  # a turn: read it to its end
                msg = next_message(ws)
            # An upstream `error` event reaches the client before its turn's row is durable
            # (unlike response.completed): wait for the turn to close before counting.
            settle(client)
            after = study.counts()
            assert after["events"] == before["events"]
            if msg["type"] == "error":
                assert msg["status"] < 500 and len(msg["error"]["message"]) > 10
                if msg["error"]["code"] in WS_OWN_CODES:
                    assert after == before, "a refused message wrote"
            # No row without a turn: at most the one cycle of this message.
            assert after["cycles"] - before["cycles"] in (0, 1)
            if after["cycles"] > before["cycles"]:
                status = study.rows("SELECT status, transport FROM cycles ORDER BY "
                                    "t_request_ns DESC LIMIT 1")[0]
                assert status == ("error" if msg["type"] == "error" else "ok", "websocket")
        # Still serving after all that: one good turn, one cycle.
        before = study.counts()
        ws.send_text(json.dumps({"type": "response.create", "model": "flowtrial-sim-1",
                                 "input": "hello", "max_output_tokens": 16}))
        while (msg := next_message(ws))["type"] not in WS_END:
            pass
        assert msg["type"] in ("response.completed", "response.incomplete"), msg
        assert study.count("cycles") == before["cycles"] + 1


# ------------------------------------------------------------------ participant page


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_participant_page_survives_any_form(served: Any, data: st.DataObject) -> None:
    study, client, ids = served
    client.cookies.clear()
    logged_in = data.draw(st.booleans(), "logged in")
    csrf = login(client, study.keys["alice"]) if logged_in else None
    try:
        task = data.draw(st.sampled_from([ids["alice_task"], ids["bob_task"], 0, 10**12])
                         | st.integers(-5, 10**6), "task")
        action = data.draw(st.sampled_from(["forecast", "start", "end", "questionnaire",
                                            "", "x"]), "action")
        path = data.draw(st.sampled_from([
            f"{PREFIX}/tasks/{task}/{action}", f"{PREFIX}/tasks/{task}", f"{PREFIX}/tasks",
            f"{PREFIX}/login", f"{PREFIX}/logout", f"{PREFIX}/", PREFIX]), "path")
        form = data.draw(st.dictionaries(
            st.sampled_from(["fast_min", "slow_min", "status", "name", "description", "key",
                             "flow_short_scale.fss1", "x"]),
            st.text(max_size=30) | st.sampled_from(["30", "-1", "nan", "1e400", "done",
                                                    "abandoned"]), max_size=5), "form")
        good_csrf = data.draw(st.booleans(), "good csrf")
        if good_csrf and csrf:
            form["csrf"] = csrf
        raw = data.draw(st.none() | st.binary(max_size=200), "raw body")
        ctype = data.draw(st.sampled_from(["application/x-www-form-urlencoded", "text/plain",
                                           "application/json", None]), "ctype")
        bobs_before = _owned(study, "bob")
        before = study.counts()
        if raw is not None:
            r = client.post(path, content=raw, headers={"content-type": ctype} if ctype else {})
        else:
            r = client.post(path, data=form) if ctype else client.post(path, content=b"")
        assert r.status_code < 500, (path, r.status_code, r.text[:300])
        assert _owned(study, "bob") == bobs_before, "another participant's data changed"
        if not (logged_in and good_csrf) and not path.endswith("/login"):
            assert study.counts() == before, "a form without session and CSRF wrote"
    finally:
        client.cookies.clear()


def _owned(study: Study, pid: str) -> list[Any]:
    rows = study.rows("SELECT * FROM tasks WHERE participant_id = :p ORDER BY id", {"p": pid})
    rows += study.rows("SELECT id FROM events WHERE participant_id = :p", {"p": pid})
    rows += study.rows("SELECT id FROM questionnaire_answers WHERE participant_id = :p",
                       {"p": pid})
    return rows


def test_fuzzing_left_the_proxy_serving(served: Any) -> None:
    """After everything above, the proxy still serves normal requests."""
    study, client, ids = served
    r = client.post("/v1/chat/completions", json=CHAT, headers=bearer(study.keys["bob"]))
    assert r.status_code == 200 and r.headers["x-flowtrial-cycle-id"]
    assert re.match(r"^cyc_[0-9a-f]+$", r.headers["x-flowtrial-cycle-id"])
    assert client.get("/flowtrial/v1/health").json()["status"] == "ok"
