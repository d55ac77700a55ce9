"""Team view (no trial needed): per week, the distribution of waits per turn, the share of
working time spent waiting, switches during waits and decisions, by person, agent or model.

Readable from 5 to 500 people and 1 to 52 weeks: each week is a distribution (a heat strip
of waits per wait length; a box over people), never one line per person; a lead highlights
a few people, whose lines are drawn only for weeks with enough waits to mean something."""

from __future__ import annotations

import altair as alt
import streamlit as st

from flowtrial.dashboards import team_data, ui

#: A highlighted person's line skips weeks with fewer waits than this (one wait is no share).
MIN_WAITS = 5
MAX_HIGHLIGHT = 8

ctx = ui.context()
observe = ctx.info.design == "observe"
st.title("Team view")
st.caption(
    ("Waits are agent turns rebuilt from the agents' own telemetry (no proxy in the path): "
     "the person's prompt → the end of the agent's last model request. " if observe else
     "Waits are the proxy's cycles (request → last token). ")
    + "Active time is the time between a person's waits, capped at the study's idle limit "
    f"({ctx.info.idle_limit_s:g} s). Each week shows how waits spread over the team, not "
    "one line per person.")
by = st.segmented_control("Group by", ["person", "agent", "model"], default="person",
                          key="team_by") or "person"
q = team_data.team_query(ctx.url, ctx.info.design, by, ctx.info.idle_limit_s, ctx.scale,
                         ctx.filters)
weekly = team_data.weekly(ctx.url, ctx.fresh, q)
if weekly.empty and not observe and ui.no_cycles(ctx, "The team view"):
    st.stop()
if weekly.empty:
    if observe:
        st.info("No agent turns yet: the team's agents send their telemetry to the OTLP "
                "receiver with the team token (docs: Team rollout). This page refreshes "
                "with the data.")
    else:
        ui.nothing_matches(weekly, ctx)
    st.stop()

if by == "person":
    names = team_data.display_names(ctx.url, ctx.fresh)
    weekly = weekly.assign(who=weekly["who"].map(lambda p: names.get(p, p)))
hours = weekly["hours_active"].sum()
wait_h = (weekly["waiting_share"].fillna(0) * weekly["hours_active"]).sum()
cap = weekly[weekly["switch_reason"] == ""]
dec = weekly["decided"].sum()
m = st.columns(6)
m[0].metric("Active hours", ui.fmt(hours, ".1f", " h"))
m[1].metric("Share of active time waiting", ui.pct(wait_h / hours if hours else None))
m[2].metric("Waits" if not observe else "Turns", f"{int(weekly['waits'].sum()):,}")
m[3].metric({"person": "People", "agent": "Agents", "model": "Models"}[by],
            weekly["who"].nunique())
m[4].metric("Switches per hour", ui.fmt(cap["switches"].sum() / cap["hours_active"].sum()
                                        if len(cap) and cap["hours_active"].sum() else None,
                                        ".1f"),
            help=None if len(cap) else "—: no focus capture (connect ActivityWatch)")
accepted = (weekly["acceptance_rate"].fillna(0) * weekly["decided"]).sum()
m[5].metric("Acceptance", ui.pct(accepted / dec if dec else None),
            help=None if dec else "—: no decisions recorded")
if cap.empty:
    st.caption("Switches: **—** no focus capture (no ActivityWatch or page focus events).")
if not dec:
    st.caption("Acceptance: **—** no decisions (no tool decisions or accept/reject events).")

x_week = alt.X("week:O", title="week (Monday, UTC)",
               axis=alt.Axis(labelAngle=-45, labelOverlap="greedy"))

st.markdown("**Waits per turn, per week**")
bins = team_data.wait_bins(ctx.url, ctx.fresh, q)
heat = alt.Chart(bins).mark_rect().encode(
    x=x_week, y=alt.Y("range_s:O", title="wait", sort=alt.SortField("bin", order="descending")),
    color=alt.Color("waits:Q", title="waits", scale=alt.Scale(scheme="blues"),
                    legend=alt.Legend(format="d", tickMinStep=1)),
    tooltip=["week", "range_s", "waits"]).properties(height=240)
ui.chart(heat, bins, f"team waits per week by {by}")

highlight: list[str] = []
if by == "person":
    people = sorted(weekly["who"].unique())
    highlight = st.multiselect(f"Highlight people (up to {MAX_HIGHLIGHT})", people,
                               max_selections=MAX_HIGHLIGHT, key="team_highlight")


def spread(col: str, title: str, axis: alt.Axis, reason_col: str | None) -> None:
    """A week-by-week box over the groups' values, highlighted people as lines."""
    st.markdown(f"**{title.capitalize()}**")
    rows = weekly[weekly[col].notna()]
    if rows.empty:
        why = (weekly[reason_col].iloc[0] if reason_col else "") or "no data"
        st.info(f"—: {why}.")
        return
    y = alt.Y(f"{col}:Q", title=title, axis=axis)
    tip = ["week", "who", "waits", alt.Tooltip(f"{col}:Q", format=axis.format or ".2f")]
    if by == "person" and rows["who"].nunique() > MAX_HIGHLIGHT:
        base = alt.Chart(rows).mark_boxplot(extent="min-max", opacity=0.5).encode(
            x=x_week, y=y)
        mine = rows[rows["who"].isin(highlight) & (rows["waits"] >= MIN_WAITS)]
        lines = alt.Chart(mine).mark_line(point=True).encode(
            x=x_week, y=y, color=alt.Color("who:N", title="highlighted"), tooltip=tip)
        ch: alt.LayerChart | alt.Chart = alt.LayerChart(layer=[base, lines])
    else:  # few groups: one line each is readable
        ch = alt.Chart(rows).mark_line(point=True).encode(
            x=x_week, y=y, color=alt.Color("who:N", title=by), tooltip=tip)
    ui.chart(ch.properties(height=220), rows[["week", "who", "waits", col]],
             f"team {title} by {by}")


spread("waiting_share", "share of active time waiting", ui.RATE_AXIS, None)
spread("switches_per_hour", "switches during waits per active hour", alt.Axis(format=".1f"),
       "switch_reason")
spread("acceptance_rate", "acceptance rate", ui.RATE_AXIS, "acceptance_reason")

st.markdown("**Agents and models** — observational: people chose their tools and tasks, "
            "so differences are not effects of the tool. Sample sizes beside every figure.")
ui.table(team_data.agents(ctx.url, ctx.fresh, q), "team agents and models")
shown = weekly.assign(
    switches_per_hour=[ui.fmt(v, ".1f") if r == "" else f"— ({r})"
                       for v, r in zip(weekly["switches_per_hour"], weekly["switch_reason"],
                                       strict=True)],
    acceptance_rate=[ui.pct(v) if r == "" else f"— ({r})"
                     for v, r in zip(weekly["acceptance_rate"], weekly["acceptance_reason"],
                                     strict=True)])
st.dataframe(ui.displayed(shown.drop(columns=["switch_reason", "acceptance_reason"])),
             hide_index=True)
ui.download(weekly, f"team weekly by {by}")
