"""Codex CLI's ``notify`` hook as an OTLP log record for the proxy's receiver.

Codex runs the program named by ``notify`` in ``config.toml`` at the end of every turn
(``codex exec`` too) with one JSON argument: ``{"type": "agent-turn-complete", "thread-id",
"turn-id", "cwd", "client", "input-messages": [...], "last-assistant-message"}``.
``flowtrial codex-notify`` turns it into the ``codex.agent_turn_complete`` log event that
Codex's own telemetry lacks and posts it (OTLP/HTTP JSON) to the proxy with the participant's
key, so it is mapped, linked and stored like the rest (a ``turn_end``). What was said is
never sent: only the messages' count and lengths.

Standard library only: Codex starts this program once per turn.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["EVENT", "NotifyError", "log_request", "post"]

EVENT = "codex.agent_turn_complete"
OTLP_LOGS_PATH = "/flowtrial/otlp/v1/logs"


class NotifyError(ValueError):
    """A notification that is not Codex's JSON, or a proxy that did not take it."""


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def log_request(notification: str, now_ns: int | None = None) -> dict[str, Any]:
    """The OTLP/JSON logs export request for one notification (its JSON text)."""
    try:
        data = json.loads(notification)
    except ValueError as exc:
        raise NotifyError(f"the notification is not JSON ({exc}): Codex passes one JSON "
                          "argument") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise NotifyError("the notification has no \"type\": not Codex's notify JSON")
    inputs = [m for m in data.get("input-messages") or [] if isinstance(m, str)]
    last = data.get("last-assistant-message")
    attrs = [_attr("event.name", EVENT), _attr("notify.type", data["type"])]
    for src, key in (("thread-id", "conversation.id"), ("turn-id", "turn.id"),
                     ("client", "client")):
        if data.get(src):
            attrs.append(_attr(key, data[src]))
    attrs += [_attr("input_messages", len(inputs)),
              _attr("input_length", sum(len(m) for m in inputs))]
    if isinstance(last, str):
        attrs.append(_attr("last_assistant_message_length", len(last)))
    t = str(now_ns if now_ns is not None else time.time_ns())
    record = {"timeUnixNano": t, "observedTimeUnixNano": t, "body": {"stringValue": EVENT},
              "attributes": attrs}
    return {"resourceLogs": [{
        "resource": {"attributes": [_attr("service.name", "codex_notify")]},
        "scopeLogs": [{"scope": {"name": "flowtrial.codex_notify"}, "logRecords": [record]}],
    }]}


def post(base_url: str, key: str, request: dict[str, Any], timeout_s: float = 5.0) -> None:
    """POST ``request`` to the proxy at ``base_url`` (its root, e.g. http://127.0.0.1:8787)."""
    req = urllib.request.Request(
        base_url.rstrip("/") + OTLP_LOGS_PATH, data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise NotifyError(f"the proxy answered {exc.code} at {req.full_url}: check the "
                          "participant key and the URL (the proxy's root)") from None
    except (urllib.error.URLError, OSError) as exc:
        raise NotifyError(f"cannot reach the proxy at {req.full_url}: {exc}") from None
