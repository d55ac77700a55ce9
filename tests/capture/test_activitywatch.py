"""ActivityWatch import: a real aw-server seeded through aw-client, its export, idempotence."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.instrumentation.activitywatch import (
    AFK,
    EDITOR,
    WEB,
    WINDOW,
    ActivityWatchError,
    import_activitywatch,
)
from flowtrial.instrumentation.capture_commands import import_activitywatch as import_command
from tests.capture.conftest import NS, T0, T0_NS, AwServer, aw_bucket, write_export

# Capture writes and reads the study database: run on SQLite and PostgreSQL.
pytestmark = pytest.mark.both_backends

# (seconds after T0, duration, data) — a morning in miniature.
WINDOW_EVENTS = [
    (0, 60, {"app": "Code", "title": "app.py — project"}),
    (60, 30, {"app": "Firefox", "title": "Inbox — Mail"}),
    (90, 60, {"app": "Code", "title": "app.py — project"}),
    (150, 20, {"app": "Slack", "title": "#team"}),
    (170, 30, {"app": "iTerm2", "title": "pytest"}),
    (200, 40, {"app": "Evince", "title": "paper.pdf"}),
]
WEB_EVENTS = [
    (60, 15, {"url": "https://mail.google.com/mail/u/0/#inbox", "title": "Inbox",
              "audible": False, "incognito": False, "tabCount": 3}),
    (75, 15, {"url": "https://docs.python.org/3/library/json.html", "title": "json",
              "audible": False, "incognito": False, "tabCount": 3}),
]
AFK_EVENTS = [
    (0, 200, {"status": "not-afk"}),
    (200, 100, {"status": "afk"}),
    (300, 60, {"status": "not-afk"}),
]
EDITOR_EVENTS = [(10, 20, {"file": "app.py", "project": "project", "language": "python"})]

EXPECTED = {
    # kind, seconds after T0, payload
    ("focus_in", 0, (("app", "code"),)),
    ("focus_out", 60, (("app", "firefox"), ("category", "mail"))),
    ("focus_out", 75, (("app", "firefox"), ("category", "docs"))),
    ("focus_in", 90, (("app", "code"),)),
    ("focus_out", 150, (("app", "slack"), ("category", "chat"))),
    ("focus_in", 170, (("app", "iterm2"),)),
    ("focus_out", 200, (("app", "evince"), ("category", "docs"))),
    ("afk_end", 0, ()),
    ("afk_start", 200, ()),
    ("afk_end", 300, ()),
}


def _timeline(study: Any, pid: str = "p01") -> set[tuple[str, float, tuple[Any, ...]]]:
    out = set()
    for kind, ts, payload, source in study.rows(
            "SELECT kind, ts_ns, payload_json, source FROM events WHERE participant_id = :p",
            p=pid):
        assert source == "activitywatch"
        p = json.loads(payload) if payload else {}
        out.add((kind, (ts - T0_NS) / NS, tuple(sorted(p.items()))))
    return out


def _seed(server: AwServer) -> None:
    from aw_client import ActivityWatchClient
    from aw_core.models import Event

    client = ActivityWatchClient("flowtrial-seed", host="127.0.0.1", port=server.port)
    for bid, type_, events in (
        ("aw-watcher-window_devbox", WINDOW, WINDOW_EVENTS),
        ("aw-watcher-web-firefox_devbox", WEB, WEB_EVENTS),
        ("aw-watcher-afk_devbox", AFK, AFK_EVENTS),
        ("aw-watcher-vscode_devbox", EDITOR, EDITOR_EVENTS),
        ("aw-watcher-input_devbox", "os.hid.input", [(0, 5, {"presses": 3})]),
    ):
        client.create_bucket(bid, type_)
        client.insert_events(bid, [
            Event(timestamp=T0 + timedelta(seconds=at), duration=timedelta(seconds=dur),
                  data=data) for at, dur, data in events])


@pytest.fixture
def seeded(aw_server: AwServer) -> AwServer:
    from aw_client import ActivityWatchClient

    client = ActivityWatchClient("flowtrial-seed", host="127.0.0.1", port=aw_server.port)
    if "aw-watcher-window_devbox" not in client.get_buckets():
        _seed(aw_server)
    return aw_server


def test_import_from_real_server_then_idempotent(seeded: AwServer, make_study: Any,
                                                 tmp_path: Path) -> None:
    study = make_study()
    report = import_activitywatch(study.database, "p01", server=seeded.url)
    assert _timeline(study) == EXPECTED
    by_bucket = {b.bucket: b for b in report.buckets}
    assert by_bucket["aw-watcher-window_devbox"].produced == 6
    assert by_bucket["aw-watcher-web-firefox_devbox"].produced == 1  # the tab change at 75 s
    assert by_bucket["aw-watcher-afk_devbox"].produced == 3
    assert by_bucket["aw-watcher-vscode_devbox"].produced == 0  # the window bucket covers it
    assert "os.hid.input" in by_bucket["aw-watcher-input_devbox"].type
    assert report.new == report.produced == len(EXPECTED)
    # Titles are content: the default capture ("fingerprint") keeps none.
    assert not any("title" in (p or "") for (p,) in study.rows(
        "SELECT payload_json FROM events"))
    # UTC exactly: ms-resolution ActivityWatch times map to exact epoch ns.
    (first,) = study.rows("SELECT min(ts_ns) FROM events")[0]
    assert first == int(T0.timestamp()) * NS

    again = import_activitywatch(study.database, "p01", server=seeded.url)
    assert again.produced == len(EXPECTED) and again.new == 0
    assert study.rows("SELECT count(*) FROM events")[0][0] == len(EXPECTED)


def test_export_file_gives_the_same_timeline(seeded: AwServer, make_study: Any,
                                             tmp_path: Path) -> None:
    from aw_client import ActivityWatchClient

    export = ActivityWatchClient("flowtrial-seed", host="127.0.0.1",
                                 port=seeded.port).export_all()
    path = tmp_path / "aw-export.json"
    path.write_text(json.dumps(export, default=str))
    study = make_study()
    first = import_activitywatch(study.database, "p01", export=path)
    assert _timeline(study) == EXPECTED
    assert first.new == len(EXPECTED)
    # Server after file: the same events, nothing new.
    assert import_activitywatch(study.database, "p01", server=seeded.url).new == 0
    assert study.rows("SELECT count(*) FROM events")[0][0] == len(EXPECTED)


def test_since_until_and_overlapping_ranges(seeded: AwServer, make_study: Any) -> None:
    study = make_study()
    since = (T0 + timedelta(seconds=100)).isoformat()
    r = import_activitywatch(study.database, "p01", server=seeded.url, since=since,
                             until=(T0 + timedelta(seconds=250)).isoformat())
    assert {(k, t) for k, t, _ in _timeline(study)} == {
        ("focus_out", 150), ("focus_in", 170), ("focus_out", 200), ("afk_start", 200)}
    assert r.new == 4
    # A wider range afterwards adds exactly the rest.
    r2 = import_activitywatch(study.database, "p01", server=seeded.url,
                              since=T0.replace(tzinfo=None).isoformat())
    assert r2.new == len(EXPECTED) - 4
    assert _timeline(study) == EXPECTED


def test_titles_with_full_content_and_participant_working_apps(tmp_path: Path,
                                                               make_study: Any) -> None:
    path = write_export(tmp_path / "e.json", {
        "w": aw_bucket("w", WINDOW, WINDOW_EVENTS),
        "web": aw_bucket("web", WEB, WEB_EVENTS, client="aw-client-web"),
    })
    study = make_study({"capture": {"content": "full"}}, participants=("p01", "p02"),
                       working_apps={"p02": ["firefox", "code"]})
    import_activitywatch(study.database, "p01", export=path)
    titles = {json.loads(p).get("title") for (p,) in study.rows(
        "SELECT payload_json FROM events WHERE participant_id = 'p01'")}
    assert {"app.py — project", "Inbox — Mail", "json", "#team"} <= titles
    # p02 works in the browser: Firefox is a working app for them, so focus stays "in".
    import_activitywatch(study.database, "p02", export=path)
    kinds = dict(((ts - T0_NS) // NS, k) for k, ts in study.rows(
        "SELECT kind, ts_ns FROM events WHERE participant_id = 'p02'"))
    assert kinds[60] == "focus_in" and kinds[150] == "focus_out"
    assert 75 not in kinds  # tab changes only refine browsers that are *not* working apps


def test_web_host_as_working_app_and_editor_only_host(tmp_path: Path, make_study: Any) -> None:
    path = write_export(tmp_path / "e.json", {
        "w": aw_bucket("w", WINDOW, [(0, 30, {"app": "chromium", "title": "x"}),
                                     (30, 30, {"app": "code", "title": "y"})]),
        "web": aw_bucket("web-chrome", WEB, [
            (0, 10, {"url": "https://claude.ai/chat/1", "title": "Claude"}),
            (10, 20, {"url": "https://news.ycombinator.com/", "title": "HN"})]),
        # A second machine without a window watcher (Wayland): editor activity only.
        "ed": aw_bucket("aw-watcher-vscode_laptop", EDITOR, [(100, 5, {"file": "a.py"})],
                        hostname="laptop", client="aw-watcher-vscode"),
    })
    study = make_study({"capture": {"working_apps": ["code", "claude.ai"]}})
    import_activitywatch(study.database, "p01", export=path)
    got = {(k, (ts - T0_NS) // NS, p) for k, ts, p in study.rows(
        "SELECT kind, ts_ns, payload_json FROM events")}
    assert ("focus_in", 0, json.dumps({"app": "claude.ai"})) in got
    assert ("focus_out", 10, json.dumps({"app": "chromium", "category": "browser"})) in got
    assert ("focus_in", 100, json.dumps({"app": "code"})) in got


def test_bad_input_is_reported(tmp_path: Path, make_study: Any) -> None:
    study = make_study()
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "an export"}')
    with pytest.raises(ActivityWatchError, match="not an ActivityWatch export"):
        import_activitywatch(study.database, "p01", export=bad)
    with pytest.raises(ActivityWatchError, match="ISO-8601"):
        import_activitywatch(study.database, "p01", export=bad, since="yesterday")
    with pytest.raises(ActivityWatchError, match="cannot reach ActivityWatch"):
        import_activitywatch(study.database, "p01", server="http://127.0.0.1:9")
    with pytest.raises(Exception, match="not enrolled"):
        import_activitywatch(study.database, "nobody", export=bad)


def test_cli_prints_table_and_fails_cleanly(tmp_path: Path, make_study: Any) -> None:
    app = typer.Typer()
    app.command()(import_command)
    study = make_study()
    path = write_export(tmp_path / "e.json", {"w": aw_bucket("w", WINDOW, WINDOW_EVENTS)})
    runner = CliRunner()
    ok = runner.invoke(app, ["--db", str(study.db), "--participant", "p01", "--export",
                             str(path)])
    assert ok.exit_code == 0, ok.output
    assert "total" in ok.output and "6" in ok.output
    both = runner.invoke(app, ["--db", str(study.db), "--participant", "p01"])
    assert both.exit_code == 2 and "exactly one of --server" in both.output
    missing = runner.invoke(app, ["--db", str(study.db), "--participant", "p01", "--export",
                                  str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "no such export file" in missing.output
