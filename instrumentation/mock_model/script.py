"""Scripted answers: the simulated model says given texts instead of corpus answers.

``[upstream.mock] script = ["…", "…"]`` (``MockModel(script=…)``): a text answer is the
script's k-th entry, k being how many of the script's entries the request's conversation
already holds as the model's answers (the last entry once all were said). So the same
request gets the same answer, and a client that re-asks after the first answer gets the
second: e.g. a first answer that breaks aider's edit format (a code fence with no file
name) and a plain second one, to test that the agent's re-ask joins the person's turn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["scripted_answer"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(part) for part in content)
    if isinstance(content, dict) and content.get("type") in ("text", "output_text", None):
        return _text(content.get("text", ""))
    return ""


def _answers(protocol: str, body: dict[str, Any]) -> list[str]:
    """The texts of the model's earlier answers held in the request."""
    if protocol == "responses":
        items = body.get("input")
        listed = items if isinstance(items, list) else []
        return [_text(i.get("content")) for i in listed if isinstance(i, dict)
                and i.get("role") == "assistant"]
    messages = body.get("messages")
    return [_text(m.get("content")) for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, dict) and m.get("role") == "assistant"]


def _norm(text: str) -> str:
    return " ".join(text.split())


def scripted_answer(script: tuple[str, ...], protocol: str, body: dict[str, Any]
                    ) -> str | None:
    """The scripted text answer to ``body`` (None without a script)."""
    if not script:
        return None
    own = {_norm(s) for s in script}
    said = sum(1 for t in _answers(protocol, body) if _norm(t) in own)
    return script[min(said, len(script) - 1)]
