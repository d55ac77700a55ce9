"""Flow timeline: one participant's day, each cycle as prompt → wait → review, with the
time focus was away (switches) and the resumption lag shaded. Where agents made multi-call
turns the wait bar is the whole turn, with its model calls and tool runs drawn inside; from
agent telemetry, the time the agent waited for the person and its tools ran.

Only that participant-day is read (indexed range queries), and the cycle numbers come from
``flowtrial.analysis.metrics.cycle_table_from_frames`` on it, so they are the report's."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from flowtrial.dashboards import data, ui
from flowtrial.dashboards.real_time import axis_format, in_real_time, utc_label

#: Drawn inside the wait bar of their turn, on its lane, as thinner bars.
INSIDE_TURN = ("model call", "tool")
PHASE_COLORS = {"wait": "#f28e2b", "model call": "#edc948", "tool": "#76b7b2",
                "review": "#4e79a7", "resumption lag": "#e15759", "away (switch)": "#9d9d9d",
                "agent waited for you": "#b07aa1", "tool running": "#59a14f"}


def agent_segments(ev: pd.DataFrame, cyc: pd.DataFrame, scale: float) -> pd.DataFrame | None:
    """Agent telemetry as bars: the agent waiting for the person (from the wait's start),
    a tool running (ending at its result); durations are raw, like the wall times."""
    parts = []
    for kind, phase in (("agent_wait", "agent waited for you"), ("tool_result", "tool running")):
        g = ev[(ev["kind"] == kind) & ev["duration_s"].notna()]
        if g.empty:
            continue
        ts = pd.to_datetime(pd.to_numeric(g["ts_ns"]).astype(np.int64), unit="ns", utc=True)
        dur = pd.to_timedelta(pd.to_numeric(g["duration_s"]).astype(float), unit="s")
        start, end = (ts, ts + dur) if kind == "agent_wait" else (ts - dur, ts)
        parts.append(pd.DataFrame({
            "phase": phase, "start": start.to_numpy(), "end": end.to_numpy(),
            "cycle_id": g["cycle_id"].to_numpy(object),
            "agent_s": pd.to_numeric(g["duration_s"]).to_numpy(float) * scale}))
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    arms = cyc.set_index("cycle_id")["arm"] if len(cyc) else pd.Series(dtype=object)
    out["arm"] = out["cycle_id"].map(arms)
    return out


def with_lanes(seg: pd.DataFrame, wait_lane: str) -> pd.DataFrame:
    """``seg`` with the lane each bar is drawn on: a turn's model calls and tool gaps on the
    lane of its wait bar (nested inside it, #17), every other phase on its own lane."""
    lane = seg["phase"].where(~seg["phase"].isin(["wait", *INSIDE_TURN]), wait_lane)
    return seg.assign(lane=lane, inside=seg["phase"].isin(INSIDE_TURN))


def build(url: str, fresh: tuple[int, ...], participant: str, day: str
          ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-cycle table, drawable segments) for one participant-day."""
    from flowtrial.analysis.metrics import (
        cycle_table_from_frames,
        frames_from_tables,
        working_overrides,
    )
    from flowtrial.analysis.switches import AFK_KINDS, FOCUS_KINDS, afk_intervals, away_episodes

    config = data.database(url).config()
    tables = data.participant_day_tables(url, fresh, participant, day)
    frames = frames_from_tables(tables, config, data.database(url).time_scale())
    cyc = cycle_table_from_frames(frames)
    scale = frames.time_scale
    req = cyc["request_at"]
    last = cyc["last_sent_at"]
    segs = []
    for phase, start, end in (
        ("wait", req, last),
        ("review", last, last + pd.to_timedelta(cyc["review_time_s"] / scale, unit="s")),
        ("resumption lag", last,
         last + pd.to_timedelta(cyc["resumption_lag_s"].where(cyc["resumption_lag_s"] > 0)
                                / scale, unit="s")),
    ):
        seg = cyc.assign(phase=phase, start=start, end=end)
        segs.append(seg[seg["end"].notna() & seg["start"].notna()])
    # Inside an agent turn's wait: its model calls and tool runs.
    from flowtrial.analysis.turns import turn_segments

    inner = turn_segments(tables["cycles"])
    if len(inner):
        segs.append(inner.merge(cyc.drop(columns=["arm"]), on="cycle_id", how="left"))
    # Away episodes (focus outside the working apps), as analysis.switches defines them.
    ev = tables["events"]
    focus = ev[ev["kind"].isin(FOCUS_KINDS)]
    if len(focus):
        import json

        payload = [json.loads(p) if isinstance(p, str) and p else {} for p in
                   focus["payload_json"]]
        focus = focus.assign(ts_ns=pd.to_numeric(focus["ts_ns"]).astype(np.int64),
                             app=[p.get("app") for p in payload],
                             category=[p.get("category") for p in payload])
        afk = ev[ev["kind"].isin(AFK_KINDS)].assign(
            ts_ns=lambda d: pd.to_numeric(d["ts_ns"]).astype(np.int64))
        ep = away_episodes(focus, afk_intervals(afk), frames.working_apps,
                           working_overrides(frames.participants))
        lo, hi = data.day_bounds_ns(day)
        ep = ep[(ep["end"] > lo) & (ep["start"] < hi)]
        if len(ep):
            away = pd.DataFrame({
                "phase": "away (switch)",
                "start": pd.to_datetime(ep["start"].to_numpy(np.int64), unit="ns", utc=True),
                "end": pd.to_datetime(ep["end"].to_numpy(np.int64), unit="ns", utc=True),
                "switch_category": ep["category"].to_numpy(object),
                "time_away_s": ep["away_ns"].to_numpy(float) / 1e9 * scale,
            })
            segs.append(away)
    if "duration_s" in ev.columns:
        agent = agent_segments(ev, cyc, scale)
        if agent is not None:
            segs.append(agent)
    seg = pd.concat(segs, ignore_index=True) if segs else pd.DataFrame()
    return cyc, seg


ctx = ui.context()
st.title("Flow timeline")
if not ui.no_cycles(ctx, "The timeline"):
    parts = list(ctx.filters.participants) or ctx.options["participants"]
    c1, c2 = st.columns(2)
    pid = c1.selectbox("Participant", parts, key="timeline_participant")
    days = data.participant_days(ctx.url, ctx.fresh, pid) if pid else []
    if ctx.filters.start or ctx.filters.end:
        days = [d for d in days if (not ctx.filters.start or d >= str(ctx.filters.start))
                and (not ctx.filters.end or d <= str(ctx.filters.end))]
    day = c2.selectbox("Day (UTC)", days, key="timeline_day") if days else None
    if not day:
        st.info(f"{pid} has no cycles in the selected dates.")
    else:
        cyc, seg = build(ctx.url, ctx.fresh, pid, day)
        if ctx.filters.arms:
            cyc = cyc[cyc["arm"].isin(ctx.filters.arms)]
            seg = seg[seg["arm"].isin(ctx.filters.arms) | seg["phase"].eq("away (switch)")]
        if "agent_s" in seg.columns:
            agent = seg[seg["phase"] == "agent waited for you"]
            if len(agent):
                st.metric("The agent waited for you", ui.fmt(agent["agent_s"].sum(), ".1f",
                                                              " s"),
                          help="Agent telemetry: time the coding agent sat waiting for your "
                               "answer (a permission prompt) this day")
        n_sw = int(cyc["switched"].sum())
        m = st.columns(4)
        turns = (cyc.attrs.get("wait_unit") or {}).get("unit") == "turn"
        m[0].metric("Agent turns this day" if turns else "Cycles this day", len(cyc))
        m[1].metric("Switched during the wait", n_sw)
        m[2].metric("Median total wait", ui.fmt(cyc["total_wait_s"].median(), ".1f", " s"))
        m[3].metric("Time waiting", ui.fmt(cyc["total_wait_s"].sum() / 60, ".1f", " min"))
        cols = ["cycle_id", "arm", "phase", "start", "end", "experienced_ttft_s",
                "total_wait_s", "idle_wait_s", "tokens_completion", "switched",
                "switch_category", "time_away_s", "resumption_lag_s", "decision",
                "review_time_s", "agent_s"]
        seg = seg.reindex(columns=cols)
        # Real time: a compressed study's raw clock stretched by time_scale (the bars are
        # then the real durations the metrics above report), 24-hour UTC labels.
        seg = in_real_time(seg, ctx.scale)
        x_format = "%H:%M"
        if len(seg):
            x_format = axis_format(seg["start"].min(), seg[["start", "end"]].max().max())
            seg["start (UTC)"] = utc_label(seg["start"], "%Y" in x_format)
        tips = [alt.Tooltip("phase:N"), alt.Tooltip("cycle_id:N"), alt.Tooltip("arm:N"),
                alt.Tooltip("start (UTC):N"),
                alt.Tooltip("experienced_ttft_s:Q", format=".2f", title="TTFT (s)"),
                alt.Tooltip("total_wait_s:Q", format=".2f", title="total wait (s)"),
                alt.Tooltip("idle_wait_s:Q", format=".2f", title="idle wait (s)"),
                alt.Tooltip("tokens_completion:Q", title="tokens"),
                alt.Tooltip("switched:N"), alt.Tooltip("switch_category:N"),
                alt.Tooltip("time_away_s:Q", format=".1f", title="away (s)"),
                alt.Tooltip("resumption_lag_s:Q", format=".1f", title="resumption lag (s)"),
                alt.Tooltip("decision:N"),
                alt.Tooltip("review_time_s:Q", format=".1f", title="review (s)"),
                alt.Tooltip("agent_s:Q", format=".1f", title="agent (s)")]
        wait_lane = "turn (wait)" if turns else "wait"
        seg = with_lanes(seg, wait_lane)
        order = [wait_lane, *(p for p in PHASE_COLORS if p not in ("wait", *INSIDE_TURN))]
        lane = alt.Y("lane:N", title=None, sort=order)
        color = alt.Color("phase:N", scale=alt.Scale(domain=list(PHASE_COLORS),
                                                     range=list(PHASE_COLORS.values())))
        real = f", real time ({ctx.scale:g}× the recorded clock)" if ctx.scale != 1 else ""
        enc = {"x": alt.X("start:T", title=f"time (UTC, 24 h{real})",
                          scale=alt.Scale(type="utc"), axis=alt.Axis(format=x_format)),
               "x2": "end:T", "y": lane, "color": color, "tooltip": tips}
        # The turn's bar spans its wait; its model calls and tool gaps sit inside it.
        bars = (alt.Chart(seg[~seg["inside"]]).mark_bar(height=18).encode(**enc)
                + alt.Chart(seg[seg["inside"]]).mark_bar(height=8).encode(**enc))
        prompts = alt.Chart(seg[seg["phase"] == "wait"]).mark_tick(
            color="black", thickness=2, size=22).encode(x=enc["x"], y=lane, tooltip=tips)
        ch = (bars + prompts).properties(height=200).interactive(bind_y=False)
        st.caption("Each prompt is a black tick; bars show the wait until the last token"
                   + (" (an agent turn's whole wait, with its model calls and the tool runs "
                      "between them drawn inside it)" if turns else "")
                   + ", the review until the decision, the resumption lag after a switch, and "
                   "the time focus was away from the working apps. Drag to pan, scroll to "
                   "zoom.")
        ui.chart(ch, seg.drop(columns="inside"), f"timeline {pid} {day}")
        from dataclasses import replace

        day_turns = data.agent_turns(ctx.url, ctx.fresh, ctx.scale,
                                     replace(ctx.filters, participants=(pid,)))
        lo_ns, hi_ns = data.day_bounds_ns(day)
        day_turns = day_turns[(day_turns["participant_id"] == pid)
                              & day_turns["start_ns"].between(lo_ns, hi_ns - 1)]
        if len(day_turns):
            st.subheader("Agent turns with telemetry")
            ui.table(day_turns.drop(columns=["participant_id", "start_ns"]),
                     f"agent turns {pid} {day}")
            st.caption("Per turn, from the agent's own telemetry: its prompt, tool decisions "
                       "(by you or its configuration) and your time to decide, its tool time "
                       "beside the proxy's, and how long it waited for you.")
