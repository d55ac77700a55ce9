"""The activity upload's guards in the real proxy app: authentication, bad bodies, the
proxy's ingest path (its job in an ingest process; 503 + Retry-After when full) and the
capture policy filter."""

from __future__ import annotations

from typing import Any

import httpx

from flowtrial.instrumentation.activitywatch import WEB, WINDOW
from flowtrial.instrumentation.aw_sync import filter_export
from flowtrial.instrumentation.proxy import create_proxy_app
from flowtrial.instrumentation.proxy.ingest import ingest_of
from tests.capture.conftest import aw_bucket
from tests.instrumentation.servers import run_asgi_server

UPLOAD = "/flowtrial/v1/activitywatch"


def _export() -> dict[str, Any]:
    return {"buckets": {"w": aw_bucket("w", WINDOW, [(0, 10, {"app": "Code"}),
                                                      (10, 10, {"app": "Slack"})])}}


def test_upload_guards(make_study: Any) -> None:
    study = make_study()
    auth = {"authorization": f"Bearer {study.keys['p01']}"}
    app = create_proxy_app(study.database, study.config)
    with run_asgi_server(app) as url:
        assert httpx.post(url + UPLOAD, json=_export()).status_code == 401
        bad = httpx.post(url + UPLOAD, content=b"{not json", headers=auth)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "not_an_export"
        other = httpx.post(url + UPLOAD, json={"hello": 1}, headers=auth)
        assert other.status_code == 422 and "not an ActivityWatch export" in other.text
        one_bucket = _export()["buckets"]["w"]  # a single bucket's export
        ok = httpx.post(url + UPLOAD, json=one_bucket, headers=auth).json()
        assert ok["new"] == 2 and ok["held"]["by_kind"] == {"focus_in": 1, "focus_out": 1}
        again = httpx.post(url + UPLOAD, json=one_bucket, headers=auth).json()
        assert again["new"] == 0 and again["received"] == 2  # idempotent
        # The ingest path full (its admission as when proxy.ingest_queue uploads run): the
        # uploader is told to come back, in the protocol's error shape, nothing stored.
        ingest_of(app.state.proxy)._running = study.config.proxy.ingest_queue
        busy = httpx.post(url + UPLOAD, json=_export(), headers=auth)
        assert busy.status_code == 503 and int(busy.headers["retry-after"]) > 0
        assert busy.json()["error"]["code"] == "ingest_busy"
    assert study.rows("SELECT count(*) FROM events")[0][0] == 2


def test_policy_filter_keeps_titles_only_when_content_is_kept() -> None:
    buckets = {
        "aw-watcher-window_mybox": {**aw_bucket("aw-watcher-window_mybox", WINDOW, [
            (0, 5, {"app": "Code", "title": "payroll.xlsx"})], hostname="mybox")},
        "aw-watcher-web-chrome_mybox": {**aw_bucket("aw-watcher-web-chrome_mybox", WEB, [
            (0, 5, {"url": "https://claude.ai/chat/123", "title": "Chat"}),
            (5, 5, {"url": "https://mail.google.com/mail/u/0/x", "title": "Mail"})],
            hostname="mybox")},
        "aw-watcher-input_mybox": {**aw_bucket("aw-watcher-input_mybox", "os.hid.input", [
            (0, 5, {"presses": 3})], hostname="mybox")},
    }
    policy = {"keep_titles": False, "working_apps": ["code", "claude.ai"]}
    out = filter_export(buckets, policy)
    text = str(out)
    assert "payroll" not in text and "mybox" not in text and "/chat/123" not in text
    assert "mail.google.com" not in text and "input" not in text
    web = next(b for b in out["buckets"].values() if b["type"] == WEB)
    assert [e["data"] for e in web["events"]] == [
        {"category": "chat", "working_host": "claude.ai"}, {"category": "mail"}]
    kept = filter_export(buckets, {**policy, "keep_titles": True})
    assert "payroll.xlsx" in str(kept)


def test_sync_needs_only_the_core_install(tmp_path: Any) -> None:
    """The participant-side command runs with none of the extras importable (no web stack,
    no aw-client): here it reaches no proxy and says so on one line, exit 2."""
    import subprocess
    import sys

    blocked = ("starlette", "uvicorn", "httpx", "jinja2", "aw_client", "requests",
               "statsmodels", "orjson", "websockets")
    code = ("import sys\n"
            f"for m in {blocked!r}: sys.modules[m] = None\n"
            "sys.argv = ['flowtrial', 'sync-activitywatch', '--proxy', 'http://127.0.0.1:9',"
            " '--key', 'ft_x_y', '--aw', 'http://127.0.0.1:9']\n"
            "from flowtrial.cli import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach http://127.0.0.1:9/flowtrial/v1/capture-policy" in proc.stderr
    assert "Traceback" not in proc.stderr
