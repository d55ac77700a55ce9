"""One participant can neither read nor write another's data; admin endpoints need the admin
token (and never show key material); the OpenAPI document is served."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from flowtrial.instrumentation.continue_data import CONTINUE_PATH
from flowtrial.instrumentation.participant_page import COOKIE, PREFIX
from flowtrial.instrumentation.proxy.openapi import OPENAPI_PATH
from flowtrial.study.participants import participant_by_key
from flowtrial.study.tasks import add_task
from tests.security.conftest import Study, bearer, login, make_study, proxy_client

CHAT = {"model": "flowtrial-sim-1", "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 8}
ADMIN_ENV = "FT_SECURITY_ADMIN_TOKEN"
ADMIN_TOKEN = "adm-" + "x7" * 16


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Study, TestClient]]:
    study = make_study(tmp_path_factory.mktemp("iso"), {"proxy": {"admin_token_env": ADMIN_ENV}},
                       participants=("alice", "bob"))
    old = os.environ.get(ADMIN_ENV)
    os.environ[ADMIN_ENV] = ADMIN_TOKEN
    try:
        with proxy_client(study) as client:
            yield study, client
    finally:
        if old is None:
            os.environ.pop(ADMIN_ENV, None)
        else:
            os.environ[ADMIN_ENV] = old
        study.database.dispose()


def a_cycle(client: TestClient, key: str) -> str:
    r = client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    assert r.status_code == 200, r.text
    return r.headers["x-flowtrial-cycle-id"]


# ------------------------------------------------------------------ event API


def test_events_naming_anothers_recorded_cycle_are_refused_whole(served: Any) -> None:
    study, client = served
    bobs = a_cycle(client, study.keys["bob"])
    alices = a_cycle(client, study.keys["alice"])
    before = study.counts()
    for batch in (
        [{"kind": "accept", "cycle_id": bobs}],
        # A valid event of her own first: the batch is all or nothing.
        [{"kind": "accept", "cycle_id": alices}, {"kind": "reject", "cycle_id": bobs}],
        [{"kind": "focus_out", "cycle_id": bobs, "payload": {"app": "Slack"}}],
        [{"kind": "accept", "cycle_id": "cyc_does_not_exist"}],
    ):
        r = client.post("/flowtrial/v1/events", json={"events": batch},
                        headers=bearer(study.keys["alice"]))
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "unknown_cycle" and "not one of your cycles" in err["message"]
    # Same answer for someone else's cycle and for none at all: no existence oracle.
    assert study.counts() == before
    # Alice's own cycle is fine (the refusals above were about ownership, not shape).
    r = client.post("/flowtrial/v1/events", json={"events": [{"kind": "accept",
                                                              "cycle_id": alices}]},
                    headers={"x-api-key": study.keys["alice"]})
    assert r.status_code == 200 and r.json() == {"accepted": 1}
    assert study.rows("SELECT participant_id FROM events WHERE cycle_id = :c",
                      {"c": alices}) == [("alice",)]
    assert study.rows("SELECT COUNT(*) FROM events WHERE cycle_id = :c", {"c": bobs})[0][0] == 0


def test_events_naming_anothers_in_flight_cycle_are_refused(served: Any) -> None:
    study, client = served
    state = client.app.state.proxy  # type: ignore[attr-defined]
    state.open_cycle("cyc_bob_in_flight", "bob")
    try:
        before = study.counts()
        r = client.post("/flowtrial/v1/events", json={"events": [
            {"kind": "focus_out", "cycle_id": "cyc_bob_in_flight"}]},
            headers=bearer(study.keys["alice"]))
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_cycle"
        assert study.counts() == before
        r = client.post("/flowtrial/v1/events", json={"events": [
            {"kind": "focus_out", "cycle_id": "cyc_bob_in_flight"}]},
            headers=bearer(study.keys["bob"]))
        assert r.status_code == 200
    finally:
        state.close_cycle("cyc_bob_in_flight")


def test_events_are_always_the_authenticated_participants(served: Any) -> None:
    """A batch cannot name whose events they are: the key decides (extra fields refused)."""
    study, client = served
    before = study.counts()
    r = client.post("/flowtrial/v1/events", json={"events": [
        {"kind": "custom", "participant_id": "bob"}]}, headers=bearer(study.keys["alice"]))
    assert r.status_code == 422 and "participant_id" in r.json()["error"]["message"]
    r = client.post("/flowtrial/v1/events", json={"participant_id": "bob", "events": [
        {"kind": "custom"}]}, headers=bearer(study.keys["alice"]))
    assert r.status_code == 422
    assert study.counts() == before


# ------------------------------------------------------------------ Continue


def test_continue_cannot_link_to_anothers_cycle(served: Any) -> None:
    study, client = served
    bobs = a_cycle(client, study.keys["bob"])
    body = {"name": "autocomplete", "schema": "0.2.0", "level": "all",
            "data": {"accepted": True, "completionId": bobs, "completion": "x = 1"}}
    r = client.post(CONTINUE_PATH, json=body, headers=bearer(study.keys["alice"]))
    assert r.status_code == 200, r.text
    assert r.json()["cycle_id"] is None and r.json()["link"] == "none"
    rows = study.rows("SELECT participant_id, cycle_id FROM events WHERE source = 'continue'")
    assert rows == [("alice", None)]
    # Bob's own post does link (the id path works; Alice's was refused by ownership).
    r = client.post(CONTINUE_PATH, json=body, headers=bearer(study.keys["bob"]))
    assert r.json()["cycle_id"] == bobs


# ------------------------------------------------------------------ participant page


def _task_state(study: Study, task_id: int) -> list[Any]:
    return study.rows("SELECT * FROM tasks WHERE id = :i", {"i": task_id})


def test_participant_page_hides_and_protects_anothers_task(served: Any) -> None:
    study, client = served
    bobs_task = add_task(study.database, "bob", "Bob's secret refactor of billing",
                         description="touches invoices.py")
    client.cookies.clear()
    csrf = login(client, study.keys["alice"])
    try:
        before_task, before = _task_state(study, bobs_task), study.counts()
        page = client.get(f"{PREFIX}/tasks/{bobs_task}")
        assert page.status_code == 404 and "secret refactor" not in page.text
        assert "secret refactor" not in client.get(f"{PREFIX}/").text
        forms = {
            "forecast": {"fast_min": "30", "slow_min": "60"},
            "start": {}, "end": {"status": "done"},
            "questionnaire": {},
        }
        for action, form in forms.items():
            r = client.post(f"{PREFIX}/tasks/{bobs_task}/{action}", data={"csrf": csrf, **form})
            assert r.status_code == 404, (action, r.status_code)
            assert "secret refactor" not in r.text
        assert _task_state(study, bobs_task) == before_task
        assert study.counts() == before
        # The same forms do work on her own task (the refusals were about ownership).
        own = add_task(study.database, "alice", "Alice's task")
        r = client.post(f"{PREFIX}/tasks/{own}/forecast",
                        data={"csrf": csrf, "fast_min": "30", "slow_min": "60"})
        assert r.status_code == 303
    finally:
        client.cookies.clear()


def test_participant_session_cookie_cannot_be_rewritten_to_another(served: Any) -> None:
    """The session names its participant and key id under an HMAC: swapping the name in the
    cookie (or re-signing it without the secret) is no session at all."""
    import base64

    study, client = served
    client.cookies.clear()
    login(client, study.keys["alice"])
    token = client.cookies.get(COOKIE)
    assert token and study.keys["alice"] not in token
    body, sig = token.split(".")
    raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw["p"] = "bob"
    forged = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    client.cookies.clear()
    client.cookies.set(COOKIE, f"{forged}.{sig}", path=PREFIX)
    r = client.get(f"{PREFIX}/")
    assert r.status_code == 303 and r.headers["location"].endswith("/login")
    client.cookies.clear()


# ------------------------------------------------------------------ admin endpoints


ADMIN = ("/flowtrial/v1/admin/status", "/flowtrial/v1/admin/participants")


def test_admin_needs_the_admin_token(served: Any) -> None:
    study, client = served
    for path in ADMIN:
        r = client.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_admin_token"
        assert r.headers["www-authenticate"].startswith("Bearer")
        for wrong in (study.keys["alice"], ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x", "é" * 20):
            header = f"Bearer {wrong}".encode("latin-1")  # any octets, not only ASCII
            r = client.get(path, headers={"authorization": header})  # type: ignore[dict-item]
            assert r.status_code == 403, (path, wrong)
            assert r.json()["error"]["code"] == "invalid_admin_token"
            assert "participant keys are not admin tokens" in r.json()["error"]["message"]
        # The x-api-key header (how participants may send keys) is not an admin credential.
        r = client.get(path, headers={"x-api-key": ADMIN_TOKEN})
        assert r.status_code == 401
        r = client.get(path, headers=bearer(ADMIN_TOKEN))
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "no-store"
        r = client.post(path, headers=bearer(ADMIN_TOKEN))
        assert r.status_code == 405


def test_admin_is_disabled_without_the_variable(served: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    study, client = served
    for value in (None, "short"):
        if value is None:
            monkeypatch.delenv(ADMIN_ENV)
        else:
            monkeypatch.setenv(ADMIN_ENV, value)
        for path in ADMIN:
            for headers in ({}, bearer(ADMIN_TOKEN), bearer(value or ""), bearer("short")):
                r = client.get(path, headers=headers)
                assert r.status_code == 403, (value, path, headers)
                err = r.json()["error"]
                assert err["code"] == "admin_disabled"
                assert ADMIN_ENV in err["message"] and "admin_token_env" in err["message"]


def test_admin_status_and_participants_report_without_key_material(served: Any) -> None:
    study, client = served
    a_cycle(client, study.keys["alice"])
    a_cycle(client, study.keys["bob"])
    st = client.get(ADMIN[0], headers=bearer(ADMIN_TOKEN)).json()
    n = study.rows("SELECT COUNT(*) FROM cycles")[0][0]
    assert st["cycles_total"] == n and sum(st["cycles"]["team"].values()) == n
    assert st["participants_enrolled"] == 2 and st["participants_seen"] == 2
    assert st["violations"] == {"team": 0}
    assert st["proxy"]["writer_queue"] >= 0 and st["proxy"]["requests"] > 0
    assert "database" in st  # the database gate's state (None without one)
    r = client.get(ADMIN[1], headers=bearer(ADMIN_TOKEN))
    people = {p["id"]: p for p in r.json()["participants"]}
    assert set(people) == {"alice", "bob"}
    counts = dict(study.rows("SELECT participant_id, COUNT(*) FROM cycles "
                             "GROUP BY participant_id"))
    for pid, p in people.items():
        assert p["arm"] == "team" and p["arms"] == ["team"] and p["cycles"] == counts[pid]
        assert p["last_seen_at"].endswith("Z") and p["last_cycle_at"] <= p["last_seen_at"]
        assert set(p) == {"id", "arm", "arms", "simulated", "cycles", "last_cycle_at",
                          "last_seen_at"}
    key_material = [study.keys["alice"], study.keys["bob"]]
    for row in study.rows("SELECT key_id, key_salt, key_hash FROM participants"):
        key_material += list(row)
    for secret in key_material:
        assert secret not in r.text and secret not in json.dumps(st)


# ------------------------------------------------------------------ keys at rest


def test_participant_keys_are_stored_as_salted_hashes(tmp_path: Path) -> None:
    import hashlib

    from flowtrial.study.keys import split_key

    study = make_study(tmp_path, participants=("p1", "p2", "p3"))
    try:
        rows = {r[0]: r[1:] for r in study.rows(
            "SELECT id, key_id, key_salt, key_hash FROM participants")}
        salts = [r[1] for r in rows.values()]
        assert len(set(salts)) == 3 and all(len(s) == 32 for s in salts)
        dump = "\n".join(map(str, study.rows("SELECT * FROM participants")))
        for pid, key in study.keys.items():
            key_id, secret = split_key(key)  # type: ignore[misc]
            stored_id, salt, stored_hash = rows[pid]
            assert stored_id == key_id
            assert stored_hash == hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()
            assert stored_hash != hashlib.sha256(secret.encode()).hexdigest()  # salted
            assert secret not in dump and key not in dump
            assert participant_by_key(study.database, key).id == pid  # type: ignore[union-attr]
            # Right key id, wrong secret: no one.
            wrong = secret[:-1] + ("y" if secret.endswith("x") else "x")
            assert participant_by_key(study.database, f"ft_{key_id}_{wrong}") is None
    finally:
        study.database.dispose()


def test_openapi_document_is_served_and_valid(served: Any) -> None:
    from jsonschema import Draft202012Validator

    _, client = served
    r = client.get(OPENAPI_PATH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) >= {"/flowtrial/v1/events", "/flowtrial/v1/health", *ADMIN}
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
