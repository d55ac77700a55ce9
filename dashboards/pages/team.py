"""Team view (no trial needed): weekly share of time spent waiting, switches per hour and
acceptance, by person or by model, for a team running the proxy in front of real traffic."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from flowtrial.dashboards import data, ui

ctx = ui.context()
st.title("Team view")
st.caption("For a team using the proxy on real work (unshaped arms are fine). Active time "
           "is the time between a person's requests, capped at the study's idle limit "
           f"({ctx.info.idle_limit_s:g} s); switches are focus_out events per active hour.")
if not ui.no_cycles(ctx, "The team view"):
    by = st.segmented_control("Group by", ["person", "model"], default="person",
                              key="team_by") or "person"
    weekly = data.team_weekly(ctx.url, ctx.fresh, ctx.scale, ctx.info.idle_limit_s, by,
                              ctx.filters)
    if not ui.nothing_matches(weekly, ctx):
        tot = weekly["hours_active"].sum()
        share = (weekly["waiting_share"] * weekly["hours_active"]).sum() / tot if tot else None
        m = st.columns(3)
        m[0].metric("Active hours", ui.fmt(tot, ".1f", " h"))
        m[1].metric("Share of active time waiting", ui.pct(share))
        m[2].metric(f"{'People' if by == 'person' else 'Models'}", weekly["who"].nunique())
        # Weeks as ordinal labels: a time axis over one week printed ticks like ".900".
        weekly = weekly.assign(week_of=pd.to_datetime(weekly["week"]).dt.strftime("%Y-%m-%d"))
        for col, title, axis in (("waiting_share", "share of time waiting", ui.RATE_AXIS),
                                 ("switches_per_hour", "switches per hour",
                                  alt.Axis(format=".1f")),
                                 ("acceptance_rate", "acceptance rate", ui.RATE_AXIS)):
            ch = alt.Chart(weekly).mark_line(point=True).encode(
                x=alt.X("week_of:O", title="week (Monday, UTC)",
                        axis=alt.Axis(labelAngle=0)),
                y=alt.Y(f"{col}:Q", title=title, axis=axis),
                color=alt.Color("who:N", title=by),
                tooltip=["week", "who", "cycles", alt.Tooltip("hours_active:Q", format=".1f"),
                         alt.Tooltip("waiting_share:Q", format=".1%"),
                         alt.Tooltip("switches_per_hour:Q", format=".1f"),
                         alt.Tooltip("acceptance_rate:Q", format=".1%")],
            ).properties(height=220)
            st.markdown(f"**{title.capitalize()}**")
            ui.chart(ch, weekly[["week", "who", "cycles", "hours_active", col]],
                     f"team {title} by {by}")
        ui.table(weekly.drop(columns="week_of"), f"team weekly by {by}")
