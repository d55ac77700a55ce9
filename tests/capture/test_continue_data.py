"""Continue's development data → decision events linked to cycles."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from flowtrial.instrumentation.continue_data import (
    CONTINUE_PATH,
    continue_routes,
    map_continue_event,
)
from tests.instrumentation.servers import run_asgi_server

# Capture writes and reads the study database: run on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

NS = 1_000_000_000
ANSWER = (
    "    for attempt in range(retries):\n"
    "        try:\n"
    "            return fetch(url, timeout=timeout)\n"
    "        except TimeoutError:\n"
    "            time.sleep(backoff * 2 ** attempt)\n"
    "    raise RuntimeError(f'gave up on {url} after {retries} attempts')\n"
)


def autocomplete(accepted: bool | None, completion: str = ANSWER,
                 completion_id: str = "3f1c8e2a-0000-4000-8000-000000000001",
                 level_all: bool = True) -> dict[str, Any]:
    """A Continue ``autocomplete`` post as ``logToOneDestination`` sends it (schema 0.2.0)."""
    data: dict[str, Any] = {
        "eventName": "autocomplete", "schema": "0.2.0", "timestamp": "2026-11-21T10:00:00Z",
        "userId": "", "userAgent": "Visual Studio Code/1.99 (Continue/1.1.0)",
        "selectedProfileId": "local", "disable": False, "useFileSuffix": True,
        "maxPromptTokens": 1024, "debounceDelay": 350, "maxSuffixPercentage": 0.2,
        "prefixPercentage": 0.3, "multilineCompletions": "auto",
        "slidingWindowPrefixPercentage": 0.75, "slidingWindowSize": 500, "useCache": True,
        "onlyMyCode": True, "useRecentlyEdited": True, "time": 412, "modelProvider": "openai",
        "modelName": "qwen2.5-coder", "cacheHit": False, "completionId": completion_id,
        "uniqueId": "u1", "gitRepo": "",
    }
    if accepted is not None:
        data["accepted"] = accepted
    if level_all:
        data.update(prefix="def get(url):\n", suffix="", prompt="<fim>", completion=completion,
                    filepath="file:///w/net.py")
    return {"name": "autocomplete", "data": data, "schema": "0.2.0",
            "level": "all" if level_all else "noCode", "profileId": "local"}


def test_mapping_table() -> None:
    assert map_continue_event(autocomplete(True)).kind == "accept"  # type: ignore[union-attr]
    rej = map_continue_event(autocomplete(False))
    assert rej is not None and rej.kind == "reject" and rej.payload["rejected_after_timeout"]
    assert map_continue_event(autocomplete(None)) is None  # shown, not decided
    edit = {"name": "editOutcome", "data": {
        "accepted": True, "completion": "```python\n" + ANSWER + "```",
        "previousCode": "pass", "newCode": "def get(url):\n" + ANSWER, "lineChange": 5,
        "modelName": "m"}}
    assert map_continue_event(edit).kind == "accept"  # type: ignore[union-attr]
    half = dict(edit, data=dict(edit["data"], newCode=ANSWER[:len(ANSWER) // 3]))
    part = map_continue_event(half)
    assert part is not None and part.kind == "partial_accept"
    assert 0.0 <= part.payload["accepted_fraction"] < 0.8
    no = dict(edit, data=dict(edit["data"], accepted=False))
    assert map_continue_event(no).kind == "reject"  # type: ignore[union-attr]
    chat = {"name": "chatInteraction", "data": {"prompt": "hi", "completion": ANSWER,
                                                "sessionId": "s", "modelName": "m"}}
    assert map_continue_event(chat).kind == "custom"  # type: ignore[union-attr]
    assert map_continue_event({"name": "tokensGenerated", "data": {}}) is None
    nxt = {"name": "nextEditOutcome", "data": {"accepted": False, "completionId": "n1"}}
    assert map_continue_event(nxt).kind == "reject"  # type: ignore[union-attr]


@pytest.fixture
def served(make_study: Any) -> Any:
    study = make_study(participants=("p01", "p02"))
    now = time.time_ns()
    # p01: an older and a newer cycle with the same answer, one with an upstream id, one in
    # the future; p02 has the same answer too.
    study.add_cycle("c_old", "p01", now - 600 * NS, now - 598 * NS, content=ANSWER)
    study.add_cycle("c_new", "p01", now - 60 * NS, now - 58 * NS, content="x = 1\n" + ANSWER)
    study.add_cycle("c_id", "p01", now - 30 * NS, now - 29 * NS, content="other",
                    upstream_response_id="cmpl-abc")
    study.add_cycle("c_future", "p01", now + 120 * NS, now + 121 * NS, content=ANSWER)
    study.add_cycle("c_p02", "p02", now - 10 * NS, now - 9 * NS, content=ANSWER)
    app = Starlette(routes=continue_routes(study.database, study.config))
    with run_asgi_server(app) as url:
        yield study, url


def _post(url: str, key: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + CONTINUE_PATH, json=body, headers=headers, timeout=10)


def test_linking_by_id_then_text_then_none(served: Any) -> None:
    study, url = served
    k1, k2 = study.keys["p01"], study.keys["p02"]
    by_id = _post(url, k1, autocomplete(True, completion="zzz", completion_id="cmpl-abc"))
    assert by_id.json() == {"accepted": 1, "duplicates": 0, "kind": "accept",
                            "cycle_id": "c_id", "link": "completion_id"}
    by_text = _post(url, k1, autocomplete(False))
    assert by_text.json()["cycle_id"] == "c_new"  # the nearest earlier match, not c_future
    assert by_text.json()["link"] == "text"
    # Continue trims the completion it shows: a part of the answer still links.
    part = _post(url, k1, autocomplete(True, completion=ANSWER[:150],
                                       completion_id="3f1c8e2a-0000-4000-8000-000000000009"))
    assert part.json()["cycle_id"] == "c_new"
    other = _post(url, k2, autocomplete(True))
    assert other.json()["cycle_id"] == "c_p02"  # each participant links to their own cycles
    no_code = _post(url, k1, autocomplete(True, level_all=False,
                                          completion_id="3f1c8e2a-0000-4000-8000-00000000000a"))
    assert no_code.json()["cycle_id"] is None and no_code.json()["link"] == "none"
    rows = study.rows("SELECT participant_id, cycle_id, kind, source, payload_json, ts_ns "
                      "FROM events ORDER BY id")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("p01", "c_id", "accept", "continue"), ("p01", "c_new", "reject", "continue"),
        ("p01", "c_new", "accept", "continue"), ("p02", "c_p02", "accept", "continue"),
        ("p01", None, "accept", "continue")]
    payload = json.loads(rows[1][4])
    assert payload["similarity"] >= 0.5 and payload["model"] == "qwen2.5-coder"
    assert "def" not in rows[1][4]  # no code from the payload is stored
    assert abs(rows[0][5] - time.time_ns()) < 60 * NS  # stamped when received (UTC ns)


def test_idempotent_auth_and_ignored(served: Any) -> None:
    study, url = served
    k1 = study.keys["p01"]
    assert _post(url, k1, autocomplete(True)).json()["accepted"] == 1
    assert _post(url, k1, autocomplete(True)).status_code == 200  # Continue re-sent it
    assert study.rows("SELECT count(*) FROM events")[0][0] == 1
    assert _post(url, None, autocomplete(True)).status_code == 401
    assert _post(url, "ft_nope_nope", autocomplete(True)).status_code == 401
    ignored = _post(url, k1, {"name": "tokensGenerated", "data": {"promptTokens": 3}})
    assert ignored.json() == {"accepted": 0, "ignored": "tokensGenerated"}
    bad = httpx.post(url + CONTINUE_PATH, content=b"{", timeout=10,
                     headers={"Authorization": f"Bearer {k1}"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert study.rows("SELECT count(*) FROM events")[0][0] == 1
