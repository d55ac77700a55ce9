"""The team view's data: :mod:`flowtrial.analysis.team` (SQL aggregates), cached per
freshness token like :mod:`flowtrial.dashboards.data`."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from sqlalchemy import select

from flowtrial.analysis.team import TeamQuery, team_agents, team_wait_bins, team_weekly

from .data import DAY_NS, PARTICIPANT, database
from .filters import Filters


def team_query(url: str, design: str, by: str, idle_limit_s: float, scale: float,
               f: Filters) -> TeamQuery:
    """The team query for a study and the sidebar filters (arms and tasks do not apply)."""
    start = pd.Timestamp(f.start, tz="UTC").value if f.start is not None else None
    end = pd.Timestamp(f.end, tz="UTC").value + DAY_NS if f.end is not None else None
    return TeamQuery(source="telemetry" if design == "observe" else "proxy",
                     by=by,  # type: ignore[arg-type]  # the page offers person/agent/model
                     idle_limit_s=idle_limit_s, time_scale=scale, start_ns=start, end_ns=end,
                     participants=tuple(f.participants),
                     dialect=database(url).engine.dialect.name)


@st.cache_data(show_spinner=False, max_entries=32)
def weekly(url: str, fresh: tuple[int, ...], q: TeamQuery) -> pd.DataFrame:
    """:func:`flowtrial.analysis.team.team_weekly`, cached."""
    with database(url).engine.connect() as conn:
        return team_weekly(conn, q)


@st.cache_data(show_spinner=False, max_entries=32)
def wait_bins(url: str, fresh: tuple[int, ...], q: TeamQuery) -> pd.DataFrame:
    """:func:`flowtrial.analysis.team.team_wait_bins`, cached."""
    with database(url).engine.connect() as conn:
        return team_wait_bins(conn, q)


@st.cache_data(show_spinner=False, max_entries=32)
def agents(url: str, fresh: tuple[int, ...], q: TeamQuery) -> pd.DataFrame:
    """:func:`flowtrial.analysis.team.team_agents`, cached."""
    with database(url).engine.connect() as conn:
        return team_agents(conn, q)


@st.cache_data(show_spinner=False, max_entries=16)
def display_names(url: str, fresh: tuple[int, ...]) -> dict[str, str]:
    """Pseudonym → the name a person chose to show (opt-in); others keep their pseudonym."""
    col = PARTICIPANT.get("display_name")
    if col is None:
        return {}
    with database(url).engine.connect() as conn:
        return {str(i): str(n) for i, n in conn.execute(
            select(PARTICIPANT.id, col).where(col.is_not(None)))}
