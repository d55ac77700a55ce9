"""Study overview: enrollment, assignments and cycles per arm, SRM, manipulation check,
data freshness."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from flowtrial.dashboards import data, ui

MAX_VIOLATION_RATE = 0.05  # analysis.checks.manipulation_check's default

ctx = ui.context()
info = ctx.info
status = info.status
st.title(f"Study overview — {info.name}")
st.caption(f"{info.design} design, randomized by {info.unit}"
           + (f"; time compressed {info.time_scale:g}× (shown in real seconds)"
              if info.time_scale != 1 else ""))

n_cycles = sum(sum(v.values()) for v in status["cycles"].values())
c1, c2, c3, c4 = st.columns(4)
c1.metric("Participants enrolled", f"{status['participants']:,}")
c2.metric("Cycles recorded", f"{n_cycles:,}")
c3.metric("Tasks", f"{status['tasks']:,}")
c4.metric("Events", f"{status['events']:,}")

# Freshness: when the last cycle finished (UTC), and how long ago.
last_ns = ctx.fresh[1]
if n_cycles and last_ns:
    last = pd.Timestamp(last_ns, unit="ns", tz="UTC")
    ago = pd.Timestamp.now(tz="UTC") - last
    st.caption(f"Data freshness: last cycle finished {last:%Y-%m-%d %H:%M:%S} UTC "
               f"({ago.total_seconds() / 3600:.1f} h ago). The dashboard re-reads the database "
               "on every interaction; caches refresh when cycles, events or tasks change.")

st.subheader("Assignments and cycles per arm")
arms = sorted(set(status["assignments"]) | set(status["cycles"]))
per_arm = pd.DataFrame({
    "arm": arms,
    "assigned participants": [status["assignments"].get(a) for a in arms],
    "cycles": [sum(status["cycles"].get(a, {}).values()) for a in arms],
    "cycles ok": [status["cycles"].get(a, {}).get("ok", 0) for a in arms],
    "cycles not ok": [sum(n for s, n in status["cycles"].get(a, {}).items() if s != "ok")
                      for a in arms],
})
ui.table(per_arm, "assignments and cycles per arm")

srm = status.get("srm")
if srm:
    p = srm.get("p_value")
    unit = "participants" if info.design == "parallel" else "cycles"
    msg = (f"Sample-ratio check ({unit} per arm vs planned weights): "
           f"χ² = {ui.fmt(srm.get('chi2'), '.2f')}, p = {ui.fmt(p, '.3g')} "
           f"(flag below {srm.get('alpha')})")
    if srm.get("flagged"):
        st.error(msg + " — **mismatch**: allocation differs from the plan; check enrollment "
                 "and the randomization before analysing.")
    else:
        st.success(msg + " — no mismatch.")
else:
    st.caption("Sample-ratio check: not applicable "
               f"({info.design} design with {len(info.arms)} arm(s)).")

if not ui.no_cycles(ctx, "The manipulation check"):
    st.subheader("Manipulation check: targeted vs achieved latency")
    summary = data.arm_summary(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    if not ui.nothing_matches(summary, ctx):
        shown = summary[["arm", "cycles", "participants", "target_ttft_s", "experienced_ttft_s",
                         "target_tps", "achieved_tps", "violation_rate"]]
        ui.table(shown, "manipulation check per arm")
        long = pd.concat([
            shown.assign(kind="target", ttft_s=shown["target_ttft_s"]),
            shown.assign(kind="achieved", ttft_s=shown["experienced_ttft_s"]),
        ])[["arm", "kind", "ttft_s", "violation_rate"]]
        ch = alt.Chart(long).mark_bar().encode(
            x=alt.X("ttft_s:Q", title="mean time to first token (s)"),
            y=alt.Y("kind:N", title=None), row=alt.Row("arm:N", title=None),
            color=alt.Color("kind:N", legend=None),
            tooltip=["arm", "kind", alt.Tooltip("ttft_s:Q", format=".2f"),
                     alt.Tooltip("violation_rate:Q", format=".1%")],
        ).properties(height=60)
        ui.chart(ch, long, "ttft target vs achieved")
        bad = shown[shown["violation_rate"] > MAX_VIOLATION_RATE]
        if len(bad):
            st.warning("Violation rate above 5 % in arm(s) "
                       + ", ".join(f"{a} ({v:.1%})" for a, v in
                                   zip(bad["arm"], bad["violation_rate"], strict=True))
                       + ": the upstream was slower than the target; see the report's "
                       "manipulation check.")
        else:
            st.success("Violation rate ≤ 5 % in every arm.")
        st.caption("Means over the filtered cycles (SQL); `flowtrial analyze` reports medians "
                   "and tolerance checks.")
