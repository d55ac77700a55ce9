"""The participant page's field-study steps in a real headless Chromium with JavaScript off:
login asking for the settings → consent → connect (key filled in) → activity upload (a plain
multipart form) → withdrawal with deletion, inside the real proxy app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowtrial.instrumentation.activitywatch import AFK, WINDOW
from flowtrial.instrumentation.participant_page import PREFIX
from flowtrial.instrumentation.proxy import create_proxy_app
from tests.capture.conftest import aw_bucket
from tests.capture.test_participant_page import ARTIFACTS, _browser
from tests.instrumentation.servers import run_asgi_server

CONSENT = {"consent": {"version": "v2", "text": "We record timings only.\n\nYou may leave."}}


def test_field_steps_in_chromium(make_study: Any, tmp_path: Path) -> None:
    study = make_study(CONSENT)
    key = study.keys["p01"]
    export = tmp_path / "aw-bucket-export.json"
    export.write_text(json.dumps({"buckets": {
        "aw-watcher-window_re": aw_bucket("aw-watcher-window_re", WINDOW, [
            (0, 30, {"app": "Code"}), (30, 30, {"app": "Slack"})]),
        "aw-watcher-afk_re": aw_bucket("aw-watcher-afk_re", AFK, [
            (0, 60, {"status": "not-afk"})])}}), encoding="utf-8")
    app = create_proxy_app(study.database, study.config)
    with run_asgi_server(app) as url:
        pw, browser = _browser(tmp_path)
        try:
            ctx = browser.new_context(java_script_enabled=False)
            page = ctx.new_page()
            page.goto(f"{url}{PREFIX}/login")
            page.fill("#key", key)
            page.check("#connect")
            page.click("button[type=submit]")
            assert "We record timings only." in page.inner_text("#consent-text")
            assert "Version v2" in page.inner_text("#consent-text")
            page.click("#agree")
            codex = page.inner_text("#client-codex")
            assert f"export FLOWTRIAL_API_KEY={key}" in codex
            assert f'base_url = "{url}' not in codex  # the study's address, not the browser's
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "participant_page_connect.png"),
                            full_page=True)
            page.click("text=Continue to your tasks")
            page.click("text=Your activity data")
            page.set_input_files("#export", str(export))
            page.click("form[enctype] button[type=submit]")
            assert page.inner_text("#received") == "3" and page.inner_text("#new") == "3"
            assert page.inner_text("#held-events") == "3"
            page.click("text=Back to your tasks")
            page.check('#withdraw input[name="delete"]')
            page.click("text=Withdraw from the study")
            assert "every record of yours is deleted" in page.inner_text("main")
            page.goto(f"{url}{PREFIX}/")
            assert page.url.endswith(f"{PREFIX}/login")
            ctx.close()
        finally:
            browser.close()
            pw.stop()
    assert study.rows("SELECT count(*) FROM participants WHERE id = 'p01'")[0][0] == 0
    assert study.rows("SELECT count(*) FROM events")[0][0] == 0
    assert [r[0] for r in study.rows("SELECT action FROM audit ORDER BY id")] == [
        "withdraw", "delete"]
