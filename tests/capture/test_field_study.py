"""The field-study walk-through (issue 31): one simulated participant through consent →
connect → prompts (official SDKs) → activity upload (a standard export and a Research
Edition one on the page and the API, and `flowtrial sync-activitywatch` against a real
aw-server) → withdrawal with deletion, checking the database at each step. The proxy is the
real app on a loopback port with its built-in extensions and simulated model."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import websockets
from typer.testing import CliRunner
from websockets.sync.client import connect as ws_connect

from flowtrial.cli import app as cli_app
from flowtrial.instrumentation.activitywatch import AFK, WEB, WINDOW
from flowtrial.instrumentation.aw_sync import filter_export, read_aw_server
from flowtrial.instrumentation.client_recipes import RECIPES, render
from flowtrial.instrumentation.participant_page import PREFIX
from flowtrial.instrumentation.proxy import create_proxy_app
from flowtrial.study.export import export_tables
from flowtrial.study.participation import give_consent, withdraw
from flowtrial.study.questionnaire import instruments_for
from flowtrial.study.status import study_status
from tests.capture.conftest import T0_NS, AwServer, aw_bucket
from tests.capture.test_activitywatch import EXPECTED, seeded  # noqa: F401 - a fixture
from tests.instrumentation.servers import run_asgi_server

NS = 1_000_000_000
# Consent, uploads, withdrawal and deletion write and read the study database: both backends.
pytestmark = pytest.mark.both_backends
MODEL = "flowtrial-sim-1"
CONSENT = {"consent": {"version": "2026-11-v1",
                       "text": "We record the timing of your assistant's answers.\n\n"
                               "You may withdraw at any time."}}
TABLES_WITH_PARTICIPANT = ("assignments", "tasks", "cycles", "turns", "events",
                           "questionnaire_answers", "draw_counters")


def _count(study: Any, table: str, pid: str = "p01") -> int:
    return int(study.rows(f"SELECT count(*) FROM {table} WHERE participant_id = :p",
                          p=pid)[0][0])


def _wait(cond: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def _chat(url: str, key: str, text: str) -> str:
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    stream = c.chat.completions.create(model=MODEL, stream=True,
                                       messages=[{"role": "user", "content": text}])
    return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def _standard_export(path: Path) -> Path:
    """aw-server's export of all buckets (titles and URLs in it), two hours after T0."""
    at = 7200
    path.write_text(json.dumps({"buckets": {
        "aw-watcher-window_laptop": aw_bucket("aw-watcher-window_laptop", WINDOW, [
            (at, 30, {"app": "Code", "title": "secret_project/main.py"}),
            (at + 30, 20, {"app": "Firefox", "title": "Private mail"}),
            (at + 50, 20, {"app": "Code", "title": "secret_project/main.py"})],
            hostname="laptop"),
        "aw-watcher-web-firefox_laptop": aw_bucket("aw-watcher-web-firefox_laptop", WEB, [
            (at + 30, 20, {"url": "https://mail.example.com/inbox/42", "title": "Private"})],
            hostname="laptop"),
    }}), encoding="utf-8")
    return path


def _research_export() -> dict[str, Any]:
    """ActivityWatch Research Edition's aw-bucket-export.json: apps and AFK, no titles or
    URLs recorded at all (three hours after T0)."""
    at = 10800
    return {"buckets": {
        "aw-watcher-window_re-host": aw_bucket("aw-watcher-window_re-host", WINDOW, [
            (at, 40, {"app": "Code"}), (at + 40, 25, {"app": "Slack"}),
            (at + 65, 30, {"app": "Code"})], hostname="re-host", client="aw-watcher-window"),
        "aw-watcher-afk_re-host": aw_bucket("aw-watcher-afk_re-host", AFK, [
            (at, 95, {"status": "not-afk"}), (at + 95, 60, {"status": "afk"})],
            hostname="re-host", client="aw-watcher-afk"),
    }}


def _no_content(study: Any) -> None:
    blob = json.dumps([list(r) for r in study.rows("SELECT payload_json FROM events")])
    for secret in ("secret_project", "Private", "mail.example.com", "app.py", "Inbox"):
        assert secret not in blob, secret


def test_walk_through(make_study: Any, seeded: AwServer, tmp_path: Path) -> None:  # noqa: F811
    study = make_study(CONSENT, participants=("p01", "p02"))
    key = study.keys["p01"]
    app = create_proxy_app(study.database, study.config)
    with run_asgi_server(app) as url:
        # 1. Before consent: refused in each protocol's error shape, nothing recorded but
        #    the refusal count.
        with pytest.raises(openai.PermissionDeniedError) as oai:
            _chat(url, key, "hello")
        assert oai.value.code == "consent_required"
        assert "/flowtrial/participant/" in oai.value.message
        ant = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        with pytest.raises(anthropic.PermissionDeniedError) as anth:
            ant.messages.create(model=MODEL, max_tokens=20,
                                messages=[{"role": "user", "content": "hi"}])
        assert anth.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
        r = httpx.post(url + "/flowtrial/v1/activitywatch", json=_research_export(),
                       headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 403
        with pytest.raises(websockets.InvalidStatus) as ws:  # the Responses WebSocket mode
            ws_connect(url.replace("http://", "ws://") + "/v1/responses",
                       additional_headers={"Authorization": f"Bearer {key}"})
        assert ws.value.response.status_code == 403
        assert json.loads(ws.value.response.body)["error"]["code"] == "consent_required"
        # Every other way in refuses too: events, Continue's destination, OTLP telemetry.
        for path in ("/flowtrial/v1/events", "/flowtrial/v1/continue",
                     "/flowtrial/otlp/v1/logs"):
            r = httpx.post(url + path, json={}, headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 403, (path, r.text)
        _wait(lambda: study.rows("SELECT refused_requests FROM participants WHERE id='p01'"
                                 )[0][0] >= 6, "the refusal count")
        for table in ("cycles", "turns", "events", "tasks"):
            assert _count(study, table) == 0, table
        st = study_status(study.database)
        assert st.awaiting_consent == 2 and st.refused_requests >= 6 and st.withdrawn == 0

        # 2. Consent on the page, then "connect your assistant" with the key filled in.
        page = httpx.Client(base_url=url, timeout=10, follow_redirects=False)
        r = page.post(f"{PREFIX}/login", data={"key": key, "connect": "yes"})
        assert r.status_code == 200 and "You may withdraw at any time." in r.text
        assert page.get(f"{PREFIX}/").headers["location"] == f"{PREFIX}/consent"
        r = page.post(f"{PREFIX}/consent", data={"csrf": _csrf(r.text), "key": key,
                                                  "version": "2026-11-v1"})
        assert r.status_code == 200
        (consent_at, version), = study.rows(
            "SELECT consent_at, consent_version FROM participants WHERE id='p01'")
        assert consent_at is not None and version == "2026-11-v1"
        codex_toml = render(RECIPES["codex"], key=key, base_url="http://127.0.0.1:8787")[0]
        assert codex_toml.text.replace('"', "&#34;") in r.text  # the page shows it escaped
        assert f"export ANTHROPIC_API_KEY={key}" in r.text

        # Later visits: a placeholder, or the key filled in when pasted again (only theirs).
        later = page.get(f"{PREFIX}/connect").text
        assert "ft_your_participant_key" in later and key not in later
        bad = page.post(f"{PREFIX}/connect", data={"csrf": _csrf(later),
                                                    "key": study.keys["p02"]})
        assert bad.status_code == 401 and study.keys["p02"] not in bad.text
        good = page.post(f"{PREFIX}/connect", data={"csrf": _csrf(later), "key": key})
        assert good.status_code == 200 and f"export FLOWTRIAL_API_KEY={key}" in good.text

        # 3. A few prompts through the official SDKs: recorded now.
        for i in range(3):
            assert _chat(url, key, f"prompt {i}").strip()
        reply = ant.messages.create(model=MODEL, max_tokens=40,
                                    messages=[{"role": "user", "content": "one more"}])
        assert reply.content
        _wait(lambda: _count(study, "cycles") == 4, "four cycles")
        assert study.rows("SELECT count(*) FROM cycles WHERE participant_id <> 'p01'"
                          )[0][0] == 0

        # 3b. A task on the page: its link at the end, then the outcome after review.
        r = page.post(f"{PREFIX}/tasks", data={"csrf": _csrf(page.get(f"{PREFIX}/").text),
                                                "name": "Issue 7: retries"})
        task_url = r.headers["location"].split("?")[0]
        csrf = _csrf(page.get(task_url).text)
        assert page.post(task_url + "/forecast", data={"csrf": csrf, "fast_min": "30",
                                                        "slow_min": "45"}).status_code == 303
        assert page.post(task_url + "/start", data={"csrf": csrf}).status_code == 303
        assert page.post(task_url + "/end", data={
            "csrf": csrf, "status": "done",
            "link": "https://github.com/acme/app/pull/7"}).status_code == 303
        answers = {f"{ins.name}.{item.id}": str(ins.points[0])
                   for ins in instruments_for(study.config) for item in ins.items}
        assert page.post(task_url + "/questionnaire",
                         data={"csrf": csrf, **answers}).status_code == 303
        assert 'id="review"' in page.get(task_url).text
        r = page.post(task_url + "/review", data={"csrf": csrf, "post_review_min": "25",
                                                   "outcome": "failed_review", "link": ""})
        assert r.status_code == 303
        assert "25.0 min, failed review" in page.get(task_url).text
        (link, post_review, outcome), = study.rows(
            "SELECT link, post_review_s, outcome FROM tasks WHERE participant_id='p01'")
        assert (link, post_review, outcome) == ("https://github.com/acme/app/pull/7", 1500.0,
                                                "failed_review")

        # 4a. A standard export uploaded on the page: titles and URLs do not get in.
        export = _standard_export(tmp_path / "aw-export.json")
        r = page.post(f"{PREFIX}/activity", files={"export": ("aw-export.json",
                                                              export.read_bytes())},
                      data={"csrf": _csrf(page.get(f"{PREFIX}/activity").text)})
        assert r.status_code == 200, r.text
        assert re.search(r'id="new">3<', r.text)
        assert _count(study, "events") == 3 + 4  # + the page's task events
        # 4b. A Research Edition export through the API, twice: the second adds nothing.
        auth = {"authorization": f"Bearer {key}"}
        first = httpx.post(url + "/flowtrial/v1/activitywatch", json=_research_export(),
                           headers=auth).json()
        again = httpx.post(url + "/flowtrial/v1/activitywatch", json=_research_export(),
                           headers=auth).json()
        assert first["new"] == 5 and again["new"] == 0 and again["received"] == 5
        assert _count(study, "events") == 8 + 4
        # 4c. The sync command against a real aw-server, filtered on "this machine".
        policy = httpx.get(url + "/flowtrial/v1/capture-policy", headers=auth).json()
        assert policy["keep_titles"] is False
        _, local = read_aw_server(seeded.url)
        sent = json.dumps(filter_export(local, policy))
        assert "Inbox" not in sent and "mail.google.com" not in sent and "app.py" not in sent
        out = CliRunner().invoke(cli_app, ["sync-activitywatch", "--proxy", url,
                                           "--key", key, "--aw", seeded.url])
        assert out.exit_code == 0, out.output
        assert f"{len(EXPECTED)} new" in out.output
        timeline = set()
        for kind, ts, payload in study.rows(
                "SELECT kind, ts_ns, payload_json FROM events WHERE participant_id='p01' "
                "AND ts_ns < :hi", hi=T0_NS + 3600 * NS):
            p = json.loads(payload) if payload else {}
            timeline.add((kind, (ts - T0_NS) / NS, tuple(sorted(p.items()))))
        assert timeline == EXPECTED
        _no_content(study)
        held = httpx.get(url + "/flowtrial/v1/activitywatch", headers=auth).json()["held"]
        assert held["events"] == 8 + len(EXPECTED) == study.rows(
            "SELECT count(*) FROM events WHERE participant_id='p01' AND source='activitywatch'"
        )[0][0]
        assert f'id="held-events">{held["events"]}<' in page.get(f"{PREFIX}/activity").text

        # 5. Another participant withdrawn from another process (the CLI): refused within
        #    the proxy's refresh interval, their data kept.
        give_consent(study.database, study.config, "p02", "2026-11-v1")
        assert _chat(url, study.keys["p02"], "hi").strip()
        withdraw(study.database, "p02")
        time.sleep(1.5)
        with pytest.raises(openai.PermissionDeniedError) as gone:
            _chat(url, study.keys["p02"], "still there?")
        assert gone.value.code == "participant_withdrawn"
        assert _count(study, "cycles", "p02") == 1

        # 6. Withdrawal with deletion from the page: refused at once, every row gone.
        r = page.post(f"{PREFIX}/withdraw", data={"csrf": _csrf(page.get(f"{PREFIX}/").text),
                                                   "delete": "yes"})
        assert r.status_code == 200 and "deleted" in r.text
        with pytest.raises((openai.AuthenticationError, openai.PermissionDeniedError)):
            _chat(url, key, "after withdrawal")
        assert page.get(f"{PREFIX}/").status_code == 303  # the session is over too
    for table in TABLES_WITH_PARTICIPANT:
        assert _count(study, table) == 0, table
    assert study.rows("SELECT count(*) FROM participants WHERE id='p01'")[0][0] == 0
    audit = study.rows("SELECT action, participant_id, detail_json FROM audit ORDER BY id")
    assert [(a, p) for a, p, _ in audit] == [("withdraw", "p02"), ("withdraw", "p01"),
                                             ("delete", "p01")]
    counts = json.loads(audit[-1][2])["rows"]
    # Events: the uploads, and the page's task start/end, forecast and questionnaire.
    assert counts["cycles"] == 4 and counts["events"] == 8 + len(EXPECTED) + 4
    assert counts["tasks"] == 1 and counts["questionnaire_answers"] > 0
    assert "prompt" not in audit[-1][2] and "Code" not in audit[-1][2]
    files = export_tables(study.database, tmp_path / "export")
    assert files["participants"] == 1
    for f in (tmp_path / "export").glob("*.csv"):
        assert "p01" not in f.read_text(encoding="utf-8"), f.name


def test_an_answer_in_flight_at_withdrawal_is_not_recorded(make_study: Any) -> None:
    slow = {"arms": [{"name": "team", "ttft_ms": 100, "tokens_per_second": 40}],
            "upstream": {"mock": {"answer_tokens": 60}}}
    study = make_study(slow, participants=("p01",))
    key = study.keys["p01"]
    app = create_proxy_app(study.database, study.config)
    with run_asgi_server(app) as url:
        page = httpx.Client(base_url=url, timeout=10, follow_redirects=False)
        assert page.post(f"{PREFIX}/login", data={"key": key}).status_code == 303
        csrf = _csrf(page.get(f"{PREFIX}/").text)
        c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        stream = c.chat.completions.create(model=MODEL, stream=True, messages=[
            {"role": "user", "content": "a long answer please"}])
        got = [next(iter(stream))]  # the answer is under way (about 1.5 s in all)
        r = page.post(f"{PREFIX}/withdraw", data={"csrf": csrf, "delete": "yes"})
        assert r.status_code == 200
        got += list(stream)
        assert len(got) > 10
        time.sleep(0.3)
    for table in TABLES_WITH_PARTICIPANT:
        assert _count(study, table) == 0, table
    assert study.rows("SELECT count(*) FROM cycles")[0][0] == 0
