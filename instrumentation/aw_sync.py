"""``flowtrial sync-activitywatch``: a participant sends their ActivityWatch data to the study
(docs/researchers/field-study.md). Core install only: the standard library's HTTP client,
no aw-client, no web stack.

1. fetch the study's capture policy from the proxy (``GET /flowtrial/v1/capture-policy``,
   authenticated with the participant's key);
2. read the local aw-server's buckets (``/api/0/buckets/…/events``; ActivityWatch on 5600,
   its Research Edition on 5667 — the first that answers when no ``--aw`` is given);
3. filter them **here, on the participant's machine** (:func:`filter_export`): only the
   bucket types flowtrial uses; window titles only when the policy keeps content; a browser
   tab becomes its category (and the host only when it is one of the working apps), never its
   URL or title; editor file and project names dropped; the machine's host name replaced by
   a stable hash;
4. post the result to ``POST /flowtrial/v1/activitywatch`` (idempotent: sending the same data
   again adds nothing) and print what the study received.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from flowtrial.study.app_categories import category_for_url, host_is_working, working_set
from flowtrial.study.errors import FlowtrialError

__all__ = ["AW_PORTS", "POLICY_PATH", "UPLOAD_PATH", "SyncError", "capture_policy",
           "filter_export", "read_aw_server", "sync"]

AW_PORTS = (5600, 5667)  # ActivityWatch, ActivityWatch Research Edition
POLICY_PATH = "/flowtrial/v1/capture-policy"
UPLOAD_PATH = "/flowtrial/v1/activitywatch"
USED_TYPES = ("currentwindow", "afkstatus", "app.editor.activity", "web.tab.current")
TIMEOUT_S = 30.0


class SyncError(FlowtrialError):
    """The sync cannot go ahead (proxy or aw-server unreachable, key refused…)."""


def capture_policy(config: Any, working_apps: Iterable[str]) -> dict[str, Any]:
    """What a participant's machine may send (served by the proxy, applied by the client)."""
    return {"study": config.study.name, "keep_titles": config.capture.content == "full",
            "bucket_types": list(USED_TYPES), "working_apps": list(working_apps),
            "upload_path": UPLOAD_PATH}


def _host_hash(host: str) -> str:
    return "host-" + hashlib.sha256(host.encode()).hexdigest()[:10]


def _filter_data(btype: str, data: Mapping[str, Any], keep_titles: bool,
                 working: frozenset[str]) -> dict[str, Any]:
    if btype == "currentwindow":
        out = {"app": data.get("app")}
        if keep_titles and isinstance(data.get("title"), str):
            out["title"] = data["title"]
        return out
    if btype == "afkstatus":
        return {"status": data.get("status")}
    if btype == "web.tab.current":
        url = data.get("url")
        tab: dict[str, Any] = {"category": category_for_url(url)}
        host = host_is_working(url, working)
        if host is not None:
            tab["working_host"] = host
        return tab
    return {}  # editor: the file, project and language stay on the machine


def filter_export(buckets: Mapping[str, Mapping[str, Any]], policy: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The export (``{"buckets": …}``) that leaves the machine under ``policy``."""
    keep_titles = bool(policy.get("keep_titles"))
    types = set(policy.get("bucket_types") or USED_TYPES)
    working = working_set(policy.get("working_apps") or [])
    out: dict[str, Any] = {}
    for bid, b in buckets.items():
        btype = str(b.get("type") or "")
        if btype not in types:
            continue
        host = str(b.get("hostname") or "")
        hashed = _host_hash(host) if host else ""
        new_id = str(bid).replace(host, hashed) if host else str(bid)
        out[new_id] = {
            "id": new_id, "type": btype, "client": b.get("client"), "hostname": hashed,
            "events": [{"timestamp": e.get("timestamp"), "duration": e.get("duration", 0),
                        "data": _filter_data(btype, e.get("data") or {}, keep_titles, working)}
                       for e in b.get("events") or [] if isinstance(e, Mapping)],
        }
    return {"buckets": out}


def _request(url: str, key: str | None = None, body: bytes | None = None) -> Any:
    headers = {"Accept": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, headers=headers,
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 - http(s) only
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            detail = ""
        raise SyncError(f"{url} answered {exc.code}{': ' + detail if detail else ''}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SyncError(f"cannot reach {url} ({getattr(exc, 'reason', exc)})") from None


def _check_url(url: str, what: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SyncError(f"{what} {url!r} is not an http(s) URL like http://127.0.0.1:5600")
    return url.rstrip("/")


def read_aw_server(aw_url: str | None) -> tuple[str, dict[str, dict[str, Any]]]:
    """The URL used and every used bucket with its events from a local aw-server."""
    urls = ([_check_url(aw_url, "--aw")] if aw_url else
            [f"http://127.0.0.1:{p}" for p in AW_PORTS])
    last: SyncError | None = None
    for url in urls:
        try:
            metas = _request(f"{url}/api/0/buckets/")
        except SyncError as exc:
            last = exc
            continue
        out = {}
        for bid, meta in (metas or {}).items():
            if meta.get("type") in USED_TYPES:
                q = urllib.parse.quote(str(bid), safe="")
                events = _request(f"{url}/api/0/buckets/{q}/events?limit=-1")
                out[str(bid)] = {**meta, "events": events or []}
        return url, out
    raise SyncError("no ActivityWatch server answered on "
                    f"{' or '.join(urls)}: start ActivityWatch (or pass --aw URL)"
                    + (f" [{last}]" if last and aw_url else ""))


def sync(proxy: str, key: str, aw_url: str | None = None) -> dict[str, Any]:
    """Read, filter and send; returns the proxy's receipt (what it now holds of you)."""
    base = _check_url(proxy, "--proxy")
    policy = _request(base + POLICY_PATH, key)
    source, buckets = read_aw_server(aw_url)
    body = json.dumps(filter_export(buckets, policy)).encode()
    receipt = _request(base + str(policy.get("upload_path") or UPLOAD_PATH), key, body)
    receipt["aw_server"] = source
    return receipt
