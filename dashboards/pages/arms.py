"""Arms: per-arm distributions of experienced wait, cycle time, task time, switch rate,
resumption lag, acceptance and persistence, agents' tool decisions, with effect estimates and
CIs from analysis."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from flowtrial.dashboards import compute, data, ui

MEASURES = ("experienced TTFT", "total wait", "cycle time")

ctx = ui.context()
st.title("Arms")


def histogram_section() -> None:
    hist = data.histograms(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    if ui.nothing_matches(hist, ctx):
        return
    st.subheader("Experienced wait and cycle time")
    # One chart per measure, each with its own x axis and its bins in numeric order (one
    # shared nominal axis mixed the measures' bins and sorted them as text).
    charts = []
    for measure in MEASURES:
        h = hist[hist["measure"] == measure]
        if h.empty:
            continue
        order = list(dict.fromkeys(h.sort_values("bin")["range_s"]))
        charts.append(alt.Chart(h, title=measure).mark_bar().encode(
            x=alt.X("range_s:N", title=f"{measure} (s)", sort=order,
                    axis=alt.Axis(labelAngle=-45)),
            y=alt.Y("cycles:Q", title="cycles", axis=ui.COUNT_AXIS),
            color=alt.Color("arm:N"), xOffset="arm:N",
            tooltip=["measure", "arm", alt.Tooltip("range_s:N", title="seconds"), "cycles"],
        ).properties(width=260, height=220))
    ch = alt.hconcat(*charts).resolve_scale(x="independent", y="independent")
    ui.chart(ch, hist, "wait and cycle time histograms")


def decision_section() -> None:
    dec = data.decisions_by_arm(ctx.url, ctx.fresh, ctx.filters)
    st.subheader("Acceptance and persistence")
    if dec.empty:
        st.info("No accept / reject decisions recorded for these cycles.")
        return
    ui.table(dec, "decisions per arm")
    long = dec.melt(id_vars="arm", value_vars=[c for c in dec.columns if c.endswith("_rate")],
                    var_name="rate", value_name="value").dropna()
    ch = alt.Chart(long).mark_bar().encode(
        x=alt.X("value:Q", title="rate", axis=ui.RATE_AXIS),
        y=alt.Y("arm:N", title=None), color="arm:N", row=alt.Row("rate:N", title=None),
        tooltip=["arm", "rate", alt.Tooltip("value:Q", format=".1%")])
    ui.chart(ch, long, "acceptance and persistence rates")


def agent_section() -> None:
    agents = data.agent_by_arm(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    if agents.empty:
        return  # no agent telemetry in this study: nothing to show
    st.subheader("Agent tool decisions")
    ui.table(agents, "agent tool decisions per arm")
    st.caption("From the coding agents' own OpenTelemetry (docs/clients/telemetry.md). "
               "Decisions the agent's configuration took are counted apart; acceptance and "
               "time to decide are the person's. The agent waited = time it sat waiting for "
               "the person's answer.")
    agent_turn_section()


def agent_turn_section() -> None:
    from flowtrial.analysis.report_sections import WAIT_BANDS_S
    from flowtrial.analysis.turn_telemetry import turn_section

    turns = data.agent_turns(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    section = turn_section(turns, WAIT_BANDS_S, len(turns))
    if section is None:
        return
    st.markdown("**Per agent turn**")
    ui.table(pd.DataFrame(section["by_arm"]), "agent turns per arm")
    if section["by_model_time_band"]:
        ui.table(pd.DataFrame(section["by_model_time_band"]),
                 "agent turns by the turn's model time")
    st.caption("Telemetry tied to agent turns (through its cycles, else by time): decisions "
               "per turn, the agent's own tool time beside the proxy's (which also holds the "
               "agent's wait for your approval), and turns the agent waited for the person; "
               "bands by the turn's model time, the part of the wait the arm sets.")


def task_section() -> None:
    from flowtrial.analysis.report import task_effect_section

    tasks = data.task_times(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    st.subheader("Task time")
    timed = tasks[np.isfinite(tasks["task_time_s"].to_numpy(float))]
    if timed.empty:
        st.info("No timed tasks yet (task start/end events or imported task times).")
        return
    ch = alt.Chart(timed.assign(task_time_min=timed["task_time_s"] / 60)).mark_boxplot().encode(
        x=alt.X("task_time_min:Q", title="task time (min)"), y=alt.Y("arm:N", title=None),
        color="arm:N", tooltip=["arm", "name", "participant_id",
                                alt.Tooltip("task_time_min:Q", format=".1f")])
    ui.chart(ch, timed, "task times")
    config = data.database(ctx.url).config()
    eff = task_effect_section(config, timed, 300.0)
    if "skipped" in eff:
        st.caption(f"Task-time effect: {eff['skipped']}")
        return
    ci = ((eff.get("ci") or {}).get("cluster_cr2") or (eff.get("ci") or {}).get("cluster")
          or (eff.get("ci") or {}).get("hc3"))
    st.metric(f"Task-time effect of {eff['treatment_arm']} vs {eff['control_arm']}",
              ui.pct(eff["estimate"]),
              help="exp(β) − 1 from analysis.effects.estimate_effect (log task time, "
                   "CR2 participant-clustered SEs, Satterthwaite t); negative = faster")
    st.caption((f"95 % CI {ui.pct(ci[0])} to {ui.pct(ci[1])}" if ci else "95 % CI not estimated")
               + f", n = {eff['n']} tasks" + (f"; {eff['note']}" if eff.get("note") else ""))
    ui.download(pd.DataFrame([{k: v for k, v in eff.items() if not isinstance(v, dict)}]),
                "task time effect")


def switch_section(table: pd.DataFrame) -> None:
    from flowtrial.analysis.report_sections import wilson

    cyc = compute.filter_cycles(table, ctx.filters, compute.task_names(ctx.url, ctx.fresh))
    cyc = cyc[cyc["status"].astype(str) == "ok"]
    if cyc.empty:
        st.warning("No completed cycles match the filters.")
        return
    g = cyc.groupby("arm")
    rates = pd.DataFrame({"cycles": g.size(), "switches": g["switched"].sum()}).reset_index()
    lo, hi = wilson(rates["switches"].to_numpy(), rates["cycles"].to_numpy())
    rates["switch_rate"] = rates["switches"] / rates["cycles"]
    rates["ci_low"], rates["ci_high"] = lo, hi
    lag = cyc[cyc["switched"].astype(bool)]
    rates = rates.merge(lag.groupby("arm")["resumption_lag_s"].median()
                        .rename("median_resumption_lag_s").reset_index(), on="arm", how="left")
    base = alt.Chart(rates).encode(y=alt.Y("arm:N", title=None))
    ch = (base.mark_bar().encode(
        x=alt.X("switch_rate:Q", title="P(switch during the wait)", axis=ui.RATE_AXIS),
        color="arm:N", tooltip=["arm", "cycles", "switches",
                                alt.Tooltip("switch_rate:Q", format=".1%"),
                                alt.Tooltip("ci_low:Q", format=".1%"),
                                alt.Tooltip("ci_high:Q", format=".1%")])
          + base.mark_rule().encode(x="ci_low:Q", x2="ci_high:Q"))
    ui.chart(ch, rates, "switch rate per arm")
    if len(lag):
        ch = alt.Chart(lag).mark_boxplot().encode(
            x=alt.X("resumption_lag_s:Q", title="resumption lag after a switch (s)"),
            y=alt.Y("arm:N", title=None), color="arm:N")
        ui.chart(ch, lag[["cycle_id", "participant_id", "arm", "resumption_lag_s",
                          "time_away_s"]], "resumption lag")
    st.caption("Switch rate with 95 % Wilson intervals; switches and resumption lag as "
               "analysis.metrics defines them (focus away from the working apps during the "
               f"wait for ≥ {ctx.info.switch_min_away_s:g} s).")


if not ui.no_cycles(ctx, "Per-arm distributions"):
    histogram_section()
    st.subheader("Context switches and resumption lag")
    switch_box = st.container()  # filled last: its computation may run in the background
    decision_section()
    agent_section()
    task_section()
    with switch_box:
        table = compute.switch_table(ctx.url, ctx.fresh)
        if table is not None:
            switch_section(table)
        else:
            @st.fragment(run_every=2.0)
            def pending() -> None:
                t = compute.switch_table(ctx.url, ctx.fresh, block=False)
                if t is None:
                    st.info(f"Classifying context switches over {ctx.n_cycles:,} cycles with "
                            "the analysis layer; this section fills in by itself in a few "
                            "seconds.")
                else:
                    switch_section(t)

            pending()
