"""How the turns depend on the typing window (docs/concepts/turns.md#the-typing-speed-rule).

:func:`typing_gaps` reads, from the recorded cycles, how soon each user-text request of a
conversation (``new_input`` or ``faster_than_typing``) followed the end of that
conversation's previous answer that ended well; :func:`window_sensitivity` counts how many
of them a given window would file as the agent's own (continuing the turn), so a study can
see whether its turns, and waits, hang on the window it chose (``flowtrial turns`` prints it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["WINDOWS_S", "typing_gaps", "window_sensitivity"]

#: The windows ``flowtrial turns`` reports on, in seconds.
WINDOWS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_USER_TEXT_RULES = ("new_input", "faster_than_typing")


def typing_gaps(database: Any) -> list[float]:
    """Seconds (raw, as recorded) from a conversation's previous well-ended answer to each
    user-text request of that conversation, for every participant."""
    from sqlalchemy import select

    from .schema import Cycle

    c = Cycle.__table__.c  # type: ignore[attr-defined]
    with database.engine.connect() as conn:
        rows = conn.execute(select(
            c.participant_id, c.conversation_key, c.kind_rule, c.status, c.t_request_ns,
            c.t_last_sent_ns, c.t_done_ns, c.mono_anchor_ns, c.wall_anchor_ns,
        ).where(c.conversation_key.is_not(None))).all()
    by_conversation: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        by_conversation.setdefault((r.participant_id, r.conversation_key), []).append(r)
    gaps: list[float] = []
    for calls in by_conversation.values():
        def wall(t: int, r: Any) -> int:
            return int(t) + int(r.wall_anchor_ns or 0) - int(r.mono_anchor_ns or 0)

        last_end: int | None = None
        for r in sorted(calls, key=lambda r: wall(r.t_request_ns, r)):
            start = wall(r.t_request_ns, r)
            if r.kind_rule in _USER_TEXT_RULES and last_end is not None and start >= last_end:
                gaps.append((start - last_end) / 1e9)
            end = r.t_last_sent_ns if r.t_last_sent_ns is not None else r.t_done_ns
            if r.status == "ok" and end is not None:
                last_end = max(last_end or 0, wall(end, r))
    return sorted(gaps)


def window_sensitivity(gaps: Sequence[float], windows: Sequence[float] = WINDOWS_S
                       ) -> list[tuple[float, int]]:
    """(window, how many of ``gaps`` it would file as the agent's) for each window."""
    return [(w, sum(1 for g in gaps if g < w)) for w in windows]
