"""Revising a request's kind by what follows it (docs/concepts/turns.md#revising-a-request).

A client may send a call nobody waits for *before* the person's request: opencode asks for
a session title (no tools, its own system prompt, the person's text as the user message)
before the main request. At its arrival nothing tells it apart from a new prompt, so it is
filed ``human`` (``new_input``) and opens a turn. When the main request arrives, on another
conversation with the same new user text, the earlier one is revised: it becomes a ``side``
call of the main request's turn (rule :data:`REVISED_RULE`, ``revised_from`` the kind and
rule it had), and its own one-call turn is gone. The proxy revises as requests arrive
(:mod:`flowtrial.instrumentation.turns.tracker`); :func:`find_revisions` finds the same
revisions in recorded cycles for :func:`flowtrial.study.turns.rebuild_turns`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .turns import Call, TurnRules

__all__ = ["REVISED_FROM", "REVISED_RULE", "apply_revisions", "find_revisions", "revisable"]

REVISED_RULE = "revised:same_input_before_main"
REVISED_FROM = "human:new_input"


def revisable(earlier_rule: str | None, earlier_offers_tools: bool | None,
              earlier_input: str | None, earlier_conversation: str | None,
              earlier_t_ns: int, later_input: str | None, later_conversation: str | None,
              later_t_ns: int, window_s: float) -> bool:
    """Whether a lone ``human`` request is a side call of a later ``human`` request: it
    was new input by default (``new_input``), offered no tools, and the later one, on
    another conversation, carries the same new user text within ``window_s``."""
    return (earlier_rule == "new_input" and earlier_offers_tools is False
            and earlier_input is not None and earlier_input == later_input
            and earlier_conversation != later_conversation
            and 0 <= later_t_ns - earlier_t_ns <= window_s * 1e9)


def find_revisions(calls: Sequence[Call], rules: TurnRules) -> dict[str, str]:
    """Earlier cycle id → the later turn id it becomes a side call of, for one participant's
    calls (each with its turn id) in request order."""
    from .turns import turn_id_for

    main_calls: dict[str, int] = {}
    for c in calls:
        if c.kind != "side" and c.turn_id is not None:
            main_calls[c.turn_id] = main_calls.get(c.turn_id, 0) + 1
    firsts = [c for c in calls if c.kind == "human" and c.turn_id == turn_id_for(c.cycle_id)]
    out: dict[str, str] = {}
    # As the proxy does: each later request revises the newest lone earlier one that fits.
    for i, later in enumerate(firsts):
        lt = later.t_request_ns + later.offset_ns
        for c in reversed(firsts[:i]):
            t = c.t_request_ns + c.offset_ns
            if lt - t > rules.revise_window_s * 1e9:
                break
            if c.cycle_id in out:
                continue
            if main_calls.get(c.turn_id or "") == 1 and revisable(
                    c.kind_rule, c.offers_tools, c.input_key, c.conversation_key, t,
                    later.input_key, later.conversation_key, lt, rules.revise_window_s):
                out[c.cycle_id] = later.turn_id  # type: ignore[assignment]
                break
    return out


def apply_revisions(calls: list[Call], rules: TurnRules, changes: dict[str, dict[str, Any]]
                    ) -> None:
    """Revise one participant's calls (in request order) as the proxy would, in place, and
    note the cycle updates in ``changes`` (cycle id -> column values)."""
    for cid, tid in find_revisions(calls, rules).items():
        changes.setdefault(cid, {}).update(request_kind="side", kind_rule=REVISED_RULE,
                                           revised_from=REVISED_FROM, turn_id=tid)
        for c in calls:
            if c.cycle_id == cid:
                c.kind, c.kind_rule, c.turn_id = "side", REVISED_RULE, tid
