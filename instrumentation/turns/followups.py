"""What a request's neighbours in time say about it: its new user text, the typing-speed
rule, and which earlier request a later one revises (docs/concepts/turns.md).

Kept apart from the request parsing in :mod:`.classify`: these read the new user text
(the last user message that is not tool output) and times, nothing else.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["faster_than_typing", "input_key", "last_user_text"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part) for part in content)
    if isinstance(content, dict):
        if content.get("type") in ("tool_result", "function_call_output", "image", "image_url",
                                   "input_image"):
            return ""
        for key in ("text", "content"):
            if key in content:
                return _text(content[key])
    return ""


def _is_tool_output(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return message.get("role") in ("tool", "function") or (isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in ("tool_result", "mcp_tool_result")
        for b in content))


def last_user_text(protocol: str, body: dict[str, Any]) -> str | None:
    """The text of the request's last user message that is not tool output (None if
    there is none): the new input a person, or the agent in their name, typed."""
    if protocol == "completions":
        return None
    if protocol == "responses":
        items = body.get("input")
        listed: list[Any] = [items] if isinstance(items, str) else (
            items if isinstance(items, list) else [])
        for item in reversed(listed):
            if isinstance(item, str):
                return item
            if isinstance(item, dict) and item.get("type") in (None, "message") and (
                    item.get("role") or "user") == "user":
                return _text(item.get("content"))
        return None
    messages = body.get("messages")
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user" and not _is_tool_output(m):
            return _text(m.get("content"))
    return None


def input_key(protocol: str, body: dict[str, Any]) -> str | None:
    """A hash of :func:`last_user_text`, whitespace-normalised (None when there is none):
    a title call and the main request carrying the same typed text share it."""
    text = last_user_text(protocol, body)
    normal = " ".join(text.split()) if text else ""
    if not normal:
        return None
    return hashlib.blake2b(normal.encode("utf-8", "replace"), digest_size=8).hexdigest()


def faster_than_typing(since_answer_s: float | None, window_s: float, person_acted: bool
                       ) -> bool:
    """The typing-speed rule: new user text this soon after the conversation's previous
    answer ended, with no sign that the person acted since, is the agent's, not theirs."""
    return since_answer_s is not None and since_answer_s < window_s and not person_acted
