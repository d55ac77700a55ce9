"""Sidebar filters shared by every page (date range, participant, arm, task).

Values live in ``st.session_state`` under keys of their own (not the widgets' keys):
Streamlit forgets a widget's state when a page without that widget runs, so each widget is
seeded from the stored value and writes back on change — the filters survive page changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import streamlit as st

STATE = "flowtrial_filters"


@dataclass(frozen=True)
class Filters:
    """The active filters; empty tuples / None mean "all" (hashable: a cache key)."""

    start: date | None = None
    end: date | None = None
    participants: tuple[str, ...] = ()
    arms: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.start or self.end or self.participants or self.arms or self.tasks)


def _stored() -> dict[str, Any]:
    return st.session_state.setdefault(STATE, {})


def _keep(name: str) -> None:
    _stored()[name] = st.session_state[f"_w_{name}"]


def current(options: dict[str, Any]) -> Filters:
    """The filters as stored, restricted to values that still exist in the study."""
    s = _stored()
    span = options.get("span")
    start = end = None
    rng = s.get("dates")
    if span and rng and len(rng) == 2:
        start, end = max(rng[0], span[0]), min(rng[1], span[1])
        if (start, end) == tuple(span):
            start = end = None  # the whole span: no date clause at all
    keep = lambda key, allowed: tuple(v for v in s.get(key, ()) if v in allowed)  # noqa: E731
    return Filters(start=start, end=end,
                   participants=keep("participants", options["participants"]),
                   arms=keep("arms", options["arms"]), tasks=keep("tasks", options["tasks"]))


def sidebar(options: dict[str, Any]) -> Filters:
    """Draw the filter widgets in the sidebar and return the active filters."""
    s = _stored()
    f = current(options)
    with st.sidebar:
        st.header("Filters")
        span = options.get("span")
        if span:
            value = (f.start or span[0], f.end or span[1])
            st.session_state["_w_dates"] = value
            st.date_input("Date range (UTC)", min_value=span[0], max_value=span[1],
                          key="_w_dates", on_change=_keep, args=("dates",))
        for name, label in (("participants", "Participant"), ("arms", "Arm"),
                            ("tasks", "Task")):
            st.session_state[f"_w_{name}"] = list(getattr(f, name))
            st.multiselect(label, options[name], key=f"_w_{name}", on_change=_keep,
                           args=(name,), placeholder="all")
        if f.active and st.button("Clear filters"):
            s.clear()
            st.rerun()
    return f
