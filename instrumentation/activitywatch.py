"""Importing ActivityWatch data as focus and AFK events on a participant's timeline.

Sources: a running ``aw-server`` (read through the ``aw-client`` library, REST API
``/api/0/buckets/…/events``) or a JSON export (``GET /api/0/export`` →
``{"buckets": {id: {…, "events": [...]}}}``). Buckets are read by type (docs/concepts/capture.md):

``currentwindow`` (aw-watcher-window, ``{app, title}``)
    Every window event becomes one focus event at its start: ``focus_in`` (payload
    ``{"app"}``) when the app is one of the participant's working apps, else ``focus_out``
    (payload ``{"app", "category"}``, see :mod:`flowtrial.study.app_categories`). The window
    title is added (``title``) only when the study keeps content (``capture.content =
    "full"``).
``web.tab.current`` (browser watchers, ``{url, title, …}``)
    Refines browser windows: the category comes from the active tab's host (mail, chat,
    docs, else browser), a tab whose host is listed among the working apps (e.g. the
    assistant's web UI, ``claude.ai``) counts as working, and a tab change inside a focused
    browser window is a focus event of its own. The URL itself is never stored.
``afkstatus`` (aw-watcher-afk, ``{status}``)
    ``afk`` events become ``afk_start``, ``not-afk`` events ``afk_end``, each at the event's
    start: an ongoing AFK period has no end yet and is closed by a later import.
``app.editor.activity`` (editor watchers, ``{file, project, language}``)
    Used only for a host without a window bucket (e.g. Wayland, where aw-watcher-window
    cannot see windows): each event is a ``focus_in`` to the editor.

Every event is keyed by its start (``dedupe_key = aw:<participant>:<bucket>:<start ns>``),
a value ActivityWatch never changes when heartbeats extend an event, so importing the same
data twice — or overlapping ranges — adds nothing. Times are UTC epoch ns, like every event.
Working apps: the participant's own list (``participants.working_apps_json``) if set, else
the study's ``capture.working_apps``.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import bindparam, text

from flowtrial.study.app_categories import (
    category_for_app,
    category_for_url,
    host_is_working,
    is_browser,
    normalize_app,
    working_set,
)
from flowtrial.study.errors import FlowtrialError
from flowtrial.study.participants import require_participant
from flowtrial.study.schema import Event
from flowtrial.study.storage import Database, WriteBatch, utcnow, write_rows
from flowtrial.study.team_rollup import WEEK_NS, refresh_rollup
from flowtrial.study.validation import check_finite, check_time_ns, load_json, time_ns

__all__ = [
    "AFK", "EDITOR", "WEB", "WINDOW", "ActivityWatchError", "AwBucket", "BucketReport",
    "ImportReport", "buckets_from_json", "convert_buckets", "import_activitywatch",
    "load_export", "load_server",
    "parse_when", "participant_working_apps", "tab_category", "tab_working_host",
    "write_buckets",
]

WINDOW = "currentwindow"
AFK = "afkstatus"
EDITOR = "app.editor.activity"
WEB = "web.tab.current"
SOURCE = "activitywatch"
NS = 1_000_000_000
# A tab event this long after its recorded end still counts as the active tab (watchers
# send heartbeats every few seconds; a focused browser may skip some).
_TAB_SLACK_NS = 30 * NS


class ActivityWatchError(FlowtrialError):
    """ActivityWatch data that cannot be read as asked (unreachable server, bad file…)."""


@dataclass
class AwEvent:
    ts_ns: int
    duration_s: float
    data: dict[str, Any]

    @property
    def end_ns(self) -> int:
        return self.ts_ns + round(self.duration_s * NS)


@dataclass
class AwBucket:
    """One ActivityWatch bucket with its events (sorted by start)."""

    id: str
    type: str
    client: str | None = None
    hostname: str | None = None
    events: list[AwEvent] = field(default_factory=list)


@dataclass
class BucketReport:
    bucket: str
    type: str
    read: int = 0  # events in the time range
    produced: int = 0  # focus / AFK events made from them
    new: int = 0  # of those, not in the database before
    note: str = ""


@dataclass
class ImportReport:
    participant_id: str
    source: str
    buckets: list[BucketReport] = field(default_factory=list)

    @property
    def produced(self) -> int:
        return sum(b.produced for b in self.buckets)

    @property
    def new(self) -> int:
        return sum(b.new for b in self.buckets)


# --------------------------------------------------------------------------- time


def parse_when(value: str | datetime | date | None, what: str = "time") -> datetime | None:
    """An ISO-8601 time (or date) as an aware UTC datetime; a time without offset is UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day)
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise ActivityWatchError(
                f"{what} {value!r} is not an ISO-8601 time: use e.g. 2026-11-21T09:00:00Z"
            ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def _event(raw: Any, where: str) -> AwEvent:
    """One event, refusing (by name) what cannot be stored: a non-object, a time that is
    not ISO-8601 or out of range, a duration that is not a finite number."""
    if not isinstance(raw, Mapping):
        raise ActivityWatchError(f"{where}: not an event object ({type(raw).__name__}): "
                                 "fix or remove it")
    ts = raw.get("timestamp")
    try:
        dt = ts if isinstance(ts, datetime) else datetime.fromisoformat(str(ts))
    except ValueError:
        raise ActivityWatchError(f"{where}: timestamp {str(ts)[:40]!r} is not an ISO-8601 "
                                 "time: fix or remove the event") from None
    dur = raw.get("duration", 0.0)
    if isinstance(dur, timedelta):
        dur = dur.total_seconds()
    if isinstance(dur, bool) or not isinstance(dur, int | float | None):
        raise ActivityWatchError(f"{where}: duration {str(dur)[:40]!r} is not a number of "
                                 "seconds: fix or remove the event")
    dur_s = max(0.0, check_finite(float(dur or 0.0), f"{where}: duration"))
    ts_ns = time_ns(dt, f"{where}: timestamp")
    check_time_ns(ts_ns + round(dur_s * NS), f"{where}: end (timestamp + duration)")
    data = raw.get("data")
    return AwEvent(ts_ns, dur_s, dict(data) if isinstance(data, Mapping) else {})


def _bucket(bid: str, meta: Mapping[str, Any], events: Iterable[Any], source: str) -> AwBucket:
    evs = [_event(r, f"{source}: bucket {bid}, event {i}") for i, r in enumerate(events)]
    evs.sort(key=lambda e: e.ts_ns)
    return AwBucket(id=str(meta.get("id") or bid), type=str(meta.get("type") or ""),
                    client=meta.get("client"), hostname=meta.get("hostname"), events=evs)


# --------------------------------------------------------------------------- sources


def load_export(path: str | Path) -> list[AwBucket]:
    """Buckets of an ActivityWatch export file (``GET /api/0/export``, or the web UI's
    "Export all buckets as JSON")."""
    p = Path(path)
    if not p.exists():
        raise ActivityWatchError(f"{p}: no such export file")
    try:
        data = load_json(p.read_text(encoding="utf-8"), str(p))
    except IsADirectoryError:
        raise ActivityWatchError(f"{p}: a folder, not an export file: give the file written "
                                 "by GET /api/0/export") from None
    except OSError as exc:
        raise ActivityWatchError(f"{p}: cannot read it ({exc.strerror}): check its "
                                 "permissions") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ActivityWatchError(f"{p}: not a JSON file ({exc})") from None
    return buckets_from_json(data, str(p))


def buckets_from_json(data: object, source: str = "upload") -> list[AwBucket]:
    """Buckets of a parsed export: ``{"buckets": {id: bucket}}`` (aw-server's ``/api/0/export``,
    also ActivityWatch Research Edition's ``aw-bucket-export.json``), ``{"buckets": [bucket]}``
    or one bucket ``{"id", "type", "events"}`` (a single bucket's export)."""
    buckets = data.get("buckets") if isinstance(data, dict) else None
    if isinstance(data, dict) and buckets is None and isinstance(data.get("events"), list):
        buckets = [data]
    if isinstance(buckets, list):
        buckets = {str(b.get("id", i)): b for i, b in enumerate(buckets) if isinstance(b, dict)}
    if not isinstance(buckets, dict):
        raise ActivityWatchError(
            f"{source}: not an ActivityWatch export (expected {{\"buckets\": {{id: {{…, "
            "\"events\": [...]}}}}}, as written by GET /api/0/export)"
        )
    out = []
    for bid, b in buckets.items():
        if isinstance(b, dict):
            evs = b.get("events")
            out.append(_bucket(bid, b, evs if isinstance(evs, list) else [], source))
    return out


def load_server(url: str, since: datetime | None = None, until: datetime | None = None,
                types: Sequence[str] = (WINDOW, AFK, EDITOR, WEB)) -> list[AwBucket]:
    """Buckets of the wanted types from a running aw-server, through ``aw-client``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ActivityWatchError(
            f"--server {url!r}: use the server's address, e.g. http://127.0.0.1:5600")
    from flowtrial.study.extras import require

    require("activitywatch", "reading from an ActivityWatch server (--server; or use "
            "--export FILE.json)")
    import requests
    from aw_client import ActivityWatchClient

    try:
        client = ActivityWatchClient("flowtrial-import", host=parts.hostname,
                                     port=parts.port or (443 if parts.scheme == "https" else 80),
                                     protocol=parts.scheme)
    except SystemExit:  # aw-client's single-instance lock exits the process instead
        raise ActivityWatchError(
            "another flowtrial ActivityWatch import is running: wait for it") from None
    try:
        metas = client.get_buckets()
        out = []
        for bid, meta in metas.items():
            if meta.get("type") not in types:
                out.append(AwBucket(str(bid), str(meta.get("type") or ""), meta.get("client"),
                                    meta.get("hostname")))
                continue
            # aw-server returns the events overlapping [start, end] *cut to it*: an event
            # begun before ``start`` comes back starting at ``start``. Asking from a second
            # earlier makes such cut events start before ``since``, where the range filter
            # drops them, so an event is always keyed by its true start.
            start = since - timedelta(seconds=1) if since is not None else None
            events = client.get_events(bid, limit=-1, start=start, end=until)
            out.append(_bucket(bid, meta, (
                {"timestamp": e.timestamp, "duration": e.duration, "data": e.data}
                for e in events), url))
        return out
    except requests.exceptions.ConnectionError:
        raise ActivityWatchError(
            f"cannot reach ActivityWatch at {url}: is aw-server running there? "
            "(or import a file with --export)") from None
    except requests.exceptions.HTTPError as exc:
        raise ActivityWatchError(f"ActivityWatch at {url} answered {exc}") from None


# --------------------------------------------------------------------------- conversion


def _family(name: str | None) -> str | None:
    """Browser family of an app name or web-watcher bucket id (tabs are matched to the
    browser window they belong to)."""
    s = (name or "").lower()
    for fam, needles in (
        ("firefox", ("firefox", "librewolf", "zen", "floorp", "waterfox")),
        ("chrome", ("chrome", "chromium", "brave", "edge", "opera", "vivaldi", "arc")),
        ("safari", ("safari",)),
    ):
        if any(n in s for n in needles):
            return fam
    return None


def _editor_app(b: AwBucket) -> str:
    """The editor an editor-watcher bucket belongs to, as a working-app name."""
    raw = (b.client or b.id.split("_")[0] or "editor").lower().removeprefix("aw-watcher-")
    return {"vscode": "code", "vs-code": "code", "sublime": "sublime_text",
            "jetbrains": "idea", "neovim": "nvim"}.get(raw, raw)


@dataclass
class _Tabs:
    starts: list[int]
    events: list[AwEvent]
    buckets: list[str]

    def at(self, t: int) -> AwEvent | None:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return None
        ev = self.events[i]
        return ev if ev.end_ns + _TAB_SLACK_NS >= t else None


def _tabs_for(browser_app: str, web: list[AwBucket]) -> _Tabs | None:
    if not web:
        return None
    fam = _family(browser_app)
    chosen = [b for b in web if fam is not None and _family(f"{b.id} {b.client}") == fam]
    if not chosen:
        chosen = web if len(web) == 1 or fam is None else []
    pairs = sorted(((e, b.id) for b in chosen for e in b.events), key=lambda p: p[0].ts_ns)
    if not pairs:
        return None
    return _Tabs([e.ts_ns for e, _ in pairs], [e for e, _ in pairs], [b for _, b in pairs])


def tab_category(data: Mapping[str, Any]) -> str:
    """A tab's category: from its URL, or as filtered on the participant's machine."""
    if "url" in data:
        return category_for_url(data.get("url"))
    cat = data.get("category")
    return str(cat) if isinstance(cat, str) and cat else "browser"


def tab_working_host(data: Mapping[str, Any], working: frozenset[str]) -> str | None:
    """The working host a tab shows (e.g. the assistant's web UI), else None."""
    if "url" in data:
        return host_is_working(data.get("url"), working)
    host = data.get("working_host")
    return str(host) if isinstance(host, str) and host.lower() in working else None


def _focus_row(pid: str, bucket: str, ev: AwEvent, ts: int, app: str, category: str,
               working: bool, title: object, keep_titles: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {"app": app}
    if not working:
        payload["category"] = category
    if keep_titles and isinstance(title, str) and title:
        payload["title"] = title
    return _row(pid, bucket, "focus_in" if working else "focus_out", ts, ev.duration_s,
                payload)


def _row(pid: str, bucket: str, kind: str, ts: int, duration_s: float | None,
         payload: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "participant_id": pid, "cycle_id": None, "kind": kind, "ts_ns": ts,
        "duration_s": duration_s, "source": SOURCE,
        "payload_json": json.dumps(payload, ensure_ascii=False) if payload is not None else None,
        "dedupe_key": f"aw:{pid}:{bucket}:{ts}", "received_at": None,
    }


def convert_buckets(
    buckets: Sequence[AwBucket],
    participant_id: str,
    working_apps: Iterable[str],
    *,
    keep_titles: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[list[dict[str, Any]], list[BucketReport]]:
    """Events rows (without ``received_at``) and a report line per bucket (module docstring)."""
    lo = time_ns(since, "--since") if since else None
    hi = time_ns(until, "--until") if until else None

    def in_range(ev: AwEvent) -> bool:
        return (lo is None or ev.ts_ns >= lo) and (hi is None or ev.ts_ns < hi)

    working = working_set(working_apps)
    ranged = [AwBucket(b.id, b.type, b.client, b.hostname, [e for e in b.events if in_range(e)])
              for b in buckets]
    web = [b for b in ranged if b.type == WEB]
    window_hosts = {b.hostname for b in ranged if b.type == WINDOW}
    rows: list[dict[str, Any]] = []
    reports: list[BucketReport] = []
    tab_cache: dict[str, _Tabs | None] = {}
    web_rows: dict[str, list[dict[str, Any]]] = {b.id: [] for b in web}

    for b in ranged:
        rep = BucketReport(b.id, b.type, read=len(b.events))
        reports.append(rep)
        if b.type == WINDOW:
            for ev in b.events:
                app = normalize_app(ev.data.get("app"))
                if app is None:
                    continue
                cat = category_for_app(app)
                work = app in working
                if is_browser(app) and not work:
                    tabs = tab_cache.setdefault(app, _tabs_for(app, web))
                    if tabs is not None:
                        # The tab active when the window got focus, then every tab change
                        # while it kept focus.
                        tab = tabs.at(ev.ts_ns)
                        if tab is not None:
                            host = tab_working_host(tab.data, working)
                            cat, work = tab_category(tab.data), host is not None
                            app = host or app
                        i = bisect.bisect_right(tabs.starts, ev.ts_ns)
                        while i < len(tabs.events) and tabs.events[i].ts_ns < ev.end_ns:
                            t = tabs.events[i]
                            host = tab_working_host(t.data, working)
                            wb = tabs.buckets[i]
                            web_rows[wb].append(_focus_row(
                                participant_id, wb, t, t.ts_ns,
                                host or normalize_app(ev.data.get("app")) or "browser",
                                tab_category(t.data), host is not None,
                                t.data.get("title"), keep_titles))
                            i += 1
                rows.append(_focus_row(participant_id, b.id, ev, ev.ts_ns, app, cat, work,
                                       ev.data.get("title"), keep_titles))
                rep.produced += 1
        elif b.type == AFK:
            for ev in b.events:
                status = str(ev.data.get("status", "")).lower()
                if status in ("afk", "not-afk"):
                    rows.append(_row(participant_id, b.id,
                                     "afk_start" if status == "afk" else "afk_end",
                                     ev.ts_ns, ev.duration_s, None))
                    rep.produced += 1
        elif b.type == EDITOR:
            if b.hostname in window_hosts:
                rep.note = "window bucket of the same host used instead"
                continue
            app = _editor_app(b)
            for ev in b.events:
                rows.append(_row(participant_id, b.id, "focus_in", ev.ts_ns, ev.duration_s,
                                 {"app": app}))
                rep.produced += 1
        elif b.type == WEB:
            rep.note = "refines browser windows"
        else:
            rep.note = "bucket type not used"
    for rep in reports:
        if rep.type == WEB:
            rep.produced = len(web_rows[rep.bucket])
            rows.extend(web_rows[rep.bucket])
    # One row per key: a tab change at a window's very start duplicates nothing, but two
    # buckets never share a key, so only exact repeats (same bucket and start) are dropped.
    seen: set[str] = set()
    unique = []
    for r in rows:
        if r["dedupe_key"] not in seen:
            seen.add(r["dedupe_key"])
            unique.append(r)
    return unique, reports


# --------------------------------------------------------------------------- import


def participant_working_apps(database: Database, participant_id: str) -> list[str]:
    """The participant's working apps: their own list if set, else the study's."""
    p = require_participant(database, participant_id)
    if p.working_apps_json:
        try:
            apps = json.loads(p.working_apps_json)
        except ValueError:
            apps = None
        if isinstance(apps, list) and apps:
            return [str(a) for a in apps]
    return list(database.config().capture.working_apps)


_EXISTING = text("SELECT dedupe_key FROM events WHERE dedupe_key IN :keys").bindparams(
    bindparam("keys", expanding=True))


def _existing_keys(database: Database, keys: list[str]) -> set[str]:
    found: set[str] = set()
    with database.engine.connect() as conn:
        for i in range(0, len(keys), 500):
            found.update(r[0] for r in conn.execute(_EXISTING, {"keys": keys[i:i + 500]}))
    return found


def import_activitywatch(
    database: Database,
    participant_id: str,
    *,
    server: str | None = None,
    export: str | Path | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
) -> ImportReport:
    """Import one participant's ActivityWatch data (exactly one of ``server``/``export``);
    idempotent. Returns what was read, made and newly written, per bucket."""
    if (server is None) == (export is None):
        raise ActivityWatchError("give exactly one of --server URL or --export FILE.json")
    lo, hi = parse_when(since, "--since"), parse_when(until, "--until")
    if lo and hi and hi <= lo:
        raise ActivityWatchError("--until must be later than --since")
    apps = participant_working_apps(database, participant_id)
    keep_titles = database.config().capture.content == "full"
    if export is not None:
        buckets = load_export(export)
        source = str(export)
    else:
        assert server is not None
        buckets = load_server(server, lo, hi)
        source = server
    return write_buckets(database, participant_id, buckets, source, apps,
                         keep_titles=keep_titles, since=lo, until=hi)


def write_buckets(database: Database, participant_id: str, buckets: Sequence[AwBucket],
                  source: str, apps: Iterable[str], *, keep_titles: bool = False,
                  since: datetime | None = None, until: datetime | None = None
                  ) -> ImportReport:
    """Convert ``buckets`` and write the events not yet in the database (idempotent)."""
    rows, reports = bucket_rows(database, participant_id, buckets, apps,
                                keep_titles=keep_titles, since=since, until=until)
    if rows:
        write_rows(database, [WriteBatch(Event, rows, ignore_conflicts=True)])
        _refresh_team_rollup(database, participant_id, min(int(r["ts_ns"]) for r in rows))
    return ImportReport(participant_id, source, reports)


def _refresh_team_rollup(database: Database, participant_id: str, since_ns: int) -> None:
    """Focus and AFK events change a team study's switches and capture flags: refresh the
    person's weekly rollup from the week before the first (a turn can start the week
    before a focus event inside it)."""
    with database.engine.begin() as conn:
        refresh_rollup(conn, participant_id, since_ns - WEEK_NS)


def bucket_rows(database: Database, participant_id: str, buckets: Sequence[AwBucket],
                apps: Iterable[str], *, keep_titles: bool = False,
                since: datetime | None = None, until: datetime | None = None
                ) -> tuple[list[dict[str, Any]], list[BucketReport]]:
    """The ``events`` rows of ``buckets`` (to be written with ``ignore_conflicts``: the ones
    already held are skipped) and a report per bucket counting the new ones."""
    rows, reports = convert_buckets(buckets, participant_id, apps, keep_titles=keep_titles,
                                    since=since, until=until)
    existing = _existing_keys(database, [r["dedupe_key"] for r in rows])
    by_bucket: dict[str, int] = {}
    now = utcnow()
    for r in rows:
        r["received_at"] = now
        if r["dedupe_key"] not in existing:
            bucket = r["dedupe_key"].split(":", 2)[2].rsplit(":", 1)[0]
            by_bucket[bucket] = by_bucket.get(bucket, 0) + 1
    for rep in reports:
        rep.new = by_bucket.get(rep.bucket, 0)
    return rows, reports
