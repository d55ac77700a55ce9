"""Study overview: enrollment, assignments and cycles per arm, SRM, manipulation check,
data freshness."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from flowtrial.dashboards import data, ui

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
               f"({status.get('srm_skipped') or 'no allocation ratio to check'}).")

if not ui.no_cycles(ctx, "The manipulation check"):
    # The report's own check on the filtered cycles (same verdict, same keys as
    # `flowtrial analyze --json`'s checks.manipulation).
    st.subheader("Manipulation check: targeted vs achieved latency")
    m = data.manipulation(ctx.url, ctx.fresh, ctx.scale, ctx.filters)
    if "skipped" in m:
        st.info(f"Manipulation check not run: {m['skipped']}")
    else:
        {"flagged": st.error, "warn": st.warning, "ok": st.success}[m["status"]](m["summary"])
        for line in [*m["problems"], *m["warnings"], *m["notes"]]:
            st.markdown(f"- {line}")
        shown = pd.DataFrame(m["by_arm"])
        ui.table(shown, "manipulation check per arm")
        long = pd.concat([shown.assign(kind=k, ttft_ms=shown[col]) for k, col in
                          (("target", "target_ttft_ms"), ("experienced", "experienced_ttft_ms"),
                           ("upstream", "upstream_ttft_ms"))])[["arm", "kind", "ttft_ms"]]
        ch = alt.Chart(long).mark_bar().encode(
            x=alt.X("ttft_ms:Q", title="median time to first token (ms, real)"),
            y=alt.Y("kind:N", title=None, sort=["target", "experienced", "upstream"]),
            row=alt.Row("arm:N", title=None), color=alt.Color("kind:N", legend=None),
            tooltip=["arm", "kind", alt.Tooltip("ttft_ms:Q", format=",.0f")],
        ).properties(height=60)
        ui.chart(ch, long, "ttft target vs achieved")
        st.caption("Columns as in `flowtrial analyze --json` (checks.manipulation.by_arm): "
                   "medians over the shaped cycles in real units (ms, tokens/s); a miss is a "
                   f"cycle later than {m['tolerance_ms']:g} ms (real) after its schedule. "
                   "The report explains each column.")
