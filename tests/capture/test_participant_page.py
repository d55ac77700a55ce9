"""The participant page in a real headless Chromium (JavaScript off), plus its guards."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from flowtrial.instrumentation.participant_page import COOKIE, PREFIX, participant_routes
from flowtrial.study.participants import assignments_for
from tests.instrumentation.servers import run_asgi_server

# Capture writes and reads the study database: run on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CROSSOVER = {
    "study": {"design": "crossover", "unit": "task"},
    "arms": [{"name": "fast", "ttft_ms": 200, "tokens_per_second": 1000},
             {"name": "slow", "ttft_ms": 8000, "tokens_per_second": 50}],
}


@pytest.fixture
def site(make_study: Any) -> Iterator[tuple[Any, str]]:
    study = make_study(CROSSOVER, participants=("p01", "p02"))
    app = Starlette(routes=participant_routes(study.database, study.config))
    with run_asgi_server(app) as url:
        yield study, url


def _browser(tmp_path: Path) -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    pw = sync_api.sync_playwright().start()
    home = tmp_path / "browser-home"
    home.mkdir()
    browser = pw.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run"],
        # Chromium keeps crash reports and caches under $HOME: keep them in tmp.
        env={"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
             "XDG_CACHE_HOME": str(home / ".cache"), "PATH": "/usr/bin:/bin"},
    )
    return pw, browser


def test_participant_flow_in_chromium(site: Any, tmp_path: Path) -> None:
    study, url = site
    key = study.keys["p01"]
    plan = assignments_for(study.database, "p01")
    pw, browser = _browser(tmp_path)
    try:
        # No JavaScript at all: every step is a plain form.
        ctx = browser.new_context(java_script_enabled=False, viewport={"width": 900,
                                                                         "height": 900})
        page = ctx.new_page()
        page.goto(f"{url}{PREFIX}/")
        assert page.url.endswith(f"{PREFIX}/login")
        page.fill("#key", "ft_wrong_key")
        page.click("button[type=submit]")
        assert "not valid" in page.inner_text(".error")
        page.fill("#key", key)
        page.click("button[type=submit]")
        assert page.url == f"{url}{PREFIX}/" and key not in page.url
        cookie = next(c for c in ctx.cookies() if c["name"] == COOKIE)
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert key not in cookie["value"]

        # Task 1: forecasts before the arm is shown, then start, end, questionnaire.
        page.fill("#name", "Issue 42: flaky retry")
        page.click("text=Add task")
        assert page.locator("#forecast").is_visible()
        assert page.locator("#arm").count() == 0  # not revealed before the forecasts
        page.fill("#fast_min", "30")
        page.fill("#slow_min", "45")
        page.click("text=Record forecasts and reveal my assistant")
        assert page.inner_text("#arm") == plan[0]
        page.click("text=Start the task now")
        assert page.locator("#running").is_visible()
        page.click("text=I am done")
        assert page.locator("#questionnaire").is_visible()
        for i in range(1, 11):
            page.check(f'input[name="flow_short_scale.fks{i}"][value="5"]')
        for item in ("mental", "physical", "temporal", "performance", "effort",
                     "frustration"):
            page.select_option(f'select[name="nasa_tlx.{item}"]', "50")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "participant_page_questionnaire.png"),
                        full_page=True)
        page.click("text=Submit answers")
        assert "answers are recorded" in page.inner_text("#finished")

        # Task 2 is the next crossover period: the other arm of the Williams sequence.
        page.click("text=Back to your tasks")
        page.fill("#name", "Issue 43: docs")
        page.click("text=Add task")
        page.fill("#fast_min", "10")
        page.fill("#slow_min", "12.5")
        page.click("text=Record forecasts and reveal my assistant")
        assert page.inner_text("#arm") == plan[1]
        page.screenshot(path=str(ARTIFACTS / "participant_page_reveal.png"), full_page=True)
        ctx.close()
    finally:
        browser.close()
        pw.stop()

    tasks = study.rows("SELECT name, forecast_fast_s, forecast_slow_s, arm, period, status, "
                       "started_at_ns, ended_at_ns, id FROM tasks ORDER BY id")
    (n1, f1, s1, a1, p1, st1, start1, end1, id1), (_, f2, s2, a2, p2, st2, *_rest) = tasks
    assert (n1, f1, s1, a1, p1, st1) == ("Issue 42: flaky retry", 1800.0, 2700.0, plan[0], 0,
                                         "done")
    assert start1 < end1
    assert (f2, s2, a2, p2, st2) == (600.0, 750.0, plan[1], 1, "planned")
    events = study.rows("SELECT kind, ts_ns, source, payload_json FROM events ORDER BY id")
    assert [(k, s) for k, _, s, _ in events] == [
        ("custom", "page"), ("task_start", "page"), ("task_end", "page"), ("custom", "page"),
        ("custom", "page")]
    assert events[1][1] == start1 and events[2][1] == end1
    assert json.loads(events[2][3]) == {"task_id": id1, "status": "done"}
    answers = study.rows("SELECT instrument, count(*), min(value), max(value) FROM "
                         "questionnaire_answers WHERE task_id = :t GROUP BY instrument "
                         "ORDER BY instrument", t=id1)
    assert answers == [("flow_short_scale", 10, 5.0, 5.0), ("nasa_tlx", 6, 50.0, 50.0)]


def _login(url: str, key: str) -> httpx.Client:
    c = httpx.Client(base_url=url, timeout=10, follow_redirects=False)
    r = c.post(f"{PREFIX}/login", data={"key": key})
    assert r.status_code == 303 and COOKIE in r.cookies
    return c


def _csrf(c: httpx.Client, path: str) -> str:
    html = c.get(path).text
    return html.split('name="csrf" value="')[1].split('"')[0]


def test_guards_csrf_origin_sessions_and_state(site: Any) -> None:
    study, url = site
    anon = httpx.Client(base_url=url, timeout=10, follow_redirects=False)
    assert anon.get(f"{PREFIX}/").headers["location"] == f"{PREFIX}/login"
    assert anon.post(f"{PREFIX}/tasks", data={"name": "x"}).status_code == 303
    evil = anon.post(f"{PREFIX}/login", data={"key": study.keys["p01"]},
                     headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and COOKIE not in evil.cookies

    c = _login(url, study.keys["p01"])
    home = c.get(f"{PREFIX}/")
    assert home.status_code == 200 and "script" not in home.headers["content-security-policy"]
    csrf = _csrf(c, f"{PREFIX}/")
    assert c.post(f"{PREFIX}/tasks", data={"name": "t", "csrf": "forged"}).status_code == 403
    assert c.post(f"{PREFIX}/tasks", data={"name": "t", "csrf": csrf},
                  headers={"Origin": "http://evil.example"}).status_code == 403
    r = c.post(f"{PREFIX}/tasks", data={"name": "t", "csrf": csrf},
               headers={"Origin": url})
    assert r.status_code == 303
    task = r.headers["location"].split("?")[0]
    assert c.post(f"{PREFIX}/tasks", data={"name": "t", "csrf": csrf}).status_code == 409
    started = c.post(f"{task}/start", data={"csrf": csrf})
    assert started.status_code == 409 and "forecasts first" in started.text
    assert c.post(f"{task}/forecast", data={"csrf": csrf, "fast_min": "0",
                                            "slow_min": "5"}).status_code == 409
    assert c.post(f"{task}/forecast", data={"csrf": csrf, "fast_min": "20",
                                            "slow_min": "25"}).status_code == 303
    again = c.post(f"{task}/forecast", data={"csrf": csrf, "fast_min": "1", "slow_min": "1"})
    assert again.status_code == 409 and "already recorded" in again.text
    assert c.post(f"{task}/start", data={"csrf": csrf}).status_code == 303
    assert c.post(f"{task}/start", data={"csrf": csrf}).status_code == 303  # double click
    early = c.post(f"{task}/questionnaire", data={"csrf": csrf})
    assert early.status_code == 409
    assert c.post(f"{task}/end", data={"csrf": csrf, "status": "done"}).status_code == 303
    missing = c.post(f"{task}/questionnaire", data={"csrf": csrf, "flow_short_scale.fks1": "3"})
    assert missing.status_code == 409 and "please answer" in missing.text
    # The answer given is kept in the re-shown form.
    assert re.search(r'name="flow_short_scale\.fks1" value="3" required\s+checked', missing.text)
    assert study.rows("SELECT count(*) FROM events WHERE kind LIKE 'task_%'")[0][0] == 2
    assert study.rows("SELECT count(*) FROM questionnaire_answers")[0][0] == 0

    # Another participant cannot see or change p01's task; a forged cookie is no session.
    other = _login(url, study.keys["p02"])
    assert other.get(task).status_code == 404
    ocsrf = _csrf(other, f"{PREFIX}/")
    assert other.post(f"{task}/end", data={"csrf": ocsrf}).status_code == 404
    forged = httpx.Client(base_url=url, timeout=10, cookies={COOKIE: "e30.AAAA"})
    assert forged.get(f"{PREFIX}/").status_code == 303
    assert c.post(f"{PREFIX}/logout", data={"csrf": csrf}).headers["location"].endswith(
        "m=loggedout")
