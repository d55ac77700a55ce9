"""Scripted answers: the simulated model says given texts instead of corpus answers.

``[upstream.mock] script = ["…", "…"]`` (``MockModel(script=…)``): a text answer is the
script's k-th entry, k being how many of the script's entries the request's conversation
already holds as the model's answers (the last entry once all were said). So the same
request gets the same answer, and a client that re-asks after the first answer gets the
second: e.g. a first answer that breaks aider's edit format (a code fence with no file
name) and a plain second one, to test that the agent's re-ask joins the person's turn.
The model's earlier answers are read by the request's protocol module (``model_answers``).
"""

from __future__ import annotations

from typing import Any

from ..proxy.protocols import BY_NAME

__all__ = ["scripted_answer"]


def _norm(text: str) -> str:
    return " ".join(text.split())


def scripted_answer(script: tuple[str, ...], protocol: str, body: dict[str, Any]
                    ) -> str | None:
    """The scripted text answer to ``body`` (None without a script)."""
    if not script:
        return None
    own = {_norm(s) for s in script}
    said = sum(1 for t in BY_NAME[protocol]().model_answers(body) if _norm(t) in own)
    return script[min(said, len(script) - 1)]
