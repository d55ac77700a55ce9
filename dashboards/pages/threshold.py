"""Flow threshold: P(switch) vs wait with the fitted hinge and smooth curves, CI band, ψ in
seconds and tokens/s, and per-participant curves (``flowtrial.analysis.threshold`` via the report's
``threshold_section``)."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from flowtrial.dashboards import compute, ui

WAITS = {"idle_wait_s": "idle wait (the report's primary measure)",
         "total_wait_s": "total wait (request → last token)",
         "experienced_ttft_s": "experienced time to first token"}

#: A participant's own switch curve needs this many waits (six bins of a few waits each).
MIN_CURVE_WAITS = 30

ctx = ui.context()
st.title("Flow threshold")
wait_col = st.radio("Wait measure", list(WAITS), format_func=WAITS.get, horizontal=True,
                    key="threshold_wait")


def curves(cyc: pd.DataFrame, res: object) -> pd.DataFrame:
    w = cyc[wait_col].to_numpy(float)
    grid = np.geomspace(max(np.nanmin(w), 0.05), np.nanmax(w), 120)
    c = res.curve(grid)  # type: ignore[attr-defined]
    rows = [pd.DataFrame({"wait_s": grid, "model": m, "p": c[m],
                          "lo": c.get(f"{m}_lo"), "hi": c.get(f"{m}_hi")})
            for m in ("hinge", "smooth")]
    return pd.concat(rows, ignore_index=True)


def headline(pt: dict, summary: dict, settings: compute.FitSettings, report_boot: int) -> None:
    """The report's headline numbers (``pt``: its personal-threshold section, {} while it is
    still being fitted) and the verdict."""
    m = st.columns(4)
    med = pt.get("median_psi_s")
    m[0].metric("Median personal threshold", ui.num(med, " s"),
                help="e^c of the random-breakpoint model: the typical person's threshold "
                     "(the report's headline)")
    m[1].metric("95 % CI", ui.ci(pt.get("ci_s"), " s") if pt else "fitting…",
                help="profile-likelihood interval, as in the report; computed only for a "
                     "threshold the test supports")
    m[2].metric("Spread τ (log-sd)", ui.num(pt.get("tau")),
                help=f"95 % CI {ui.ci(pt.get('tau_ci'))}; test of τ = 0: "
                     f"p = {ui.num(pt.get('p_tau_zero'))}")
    m[3].metric("Existence test p (quick)", ui.num(summary.get("p_exists")),
                help=f"{settings.n_boot} null replicates here; the report's test uses "
                     f"{report_boot} (`flowtrial analyze`)")
    st.caption(f"Secondary: pooled onset ψ* = {ui.num(summary.get('psi_s'), ' s')} (quick "
               f"95 % CI {ui.ci(summary.get('ci_s'), ' s')}), where the population-averaged "
               "curve starts rising.")
    speed = pt.get("speed_table") or {}
    if speed.get("rows"):
        st.caption("What a model speed means for the median person: share of this study's "
                   "answers whose idle wait would exceed the median threshold (range: ψ's "
                   "95 % CI and reading speeds "
                   f"{ui.ci(speed['reading_tps_range'], ' tok/s')}).")
        st.dataframe(pd.DataFrame([{
            "tokens/s": r["tokens_per_second"], "TTFT (s)": r["ttft_s"],
            "share waiting longer than ψ": f"{100 * r['share']:.0f} %",
            "range": f"{100 * r['share_range'][0]:.0f}–{100 * r['share_range'][1]:.0f} %"}
            for r in speed["rows"]]), hide_index=True)
    elif speed.get("reason"):
        st.caption(f"Model speed in tokens/s: {speed['reason']}.")
    st.info(f"Same estimators and settings as the report (`flowtrial analyze`), printed the "
            "same way: without filters the median personal threshold, its 95 % CI and τ are "
            f"the report's. Quicker here: ψ*'s bootstrap CI and the existence test use "
            f"{settings.n_boot} replicates instead of the report's {report_boot}, so they (and "
            "a verdict near p = 0.05) may differ slightly; the report's are the preregistered "
            "values.")
    if pt.get("found"):
        st.success(f"Threshold found: the median person's switching rises above "
                   f"{ui.num(med, ' s')}; people differ by a log-sd of {ui.num(pt['tau'])}.")
    elif pt or summary.get("reason"):  # no verdict while the headline is being fitted
        st.warning(pt.get("reason") or summary.get("reason"))


def show(table: pd.DataFrame) -> None:
    from flowtrial.analysis.report_sections import analysable, binned_rate

    cyc = analysable(compute.filter_cycles(table, ctx.filters,
                                           compute.task_names(ctx.url, ctx.fresh)), wait_col)
    if cyc.empty:
        st.warning("No completed cycles with a wait match the filters.")
        return
    key = (ctx.url, ctx.fresh, ctx.filters)
    settings = compute.dashboard_settings(ctx.url)
    report_boot = compute.report_settings(ctx.url).n_boot
    fit = compute.threshold_fit(key, cyc, wait_col, settings,
                                block=len(cyc) <= compute.SYNC_CYCLES)
    if fit is None:
        st.info(f"Fitting the threshold on {len(cyc):,} cycles (bootstrap CI); the fit "
                "appears here in a few seconds.")
        return
    summary, res = fit
    pt = compute.personal_fit(key, cyc, wait_col, summary, settings) or {}
    if pt:
        headline(pt, summary, settings, report_boot)
    else:
        # The personal fit runs in the background: this part re-checks every 2 s and fills
        # in by itself (the rest of the page does not wait for it).
        @st.fragment(run_every=2.0)
        def pending() -> None:
            done = compute.personal_fit(key, cyc, wait_col, summary, settings) or {}
            if not done:
                st.info("Fitting the personal thresholds (random-breakpoint model); the "
                        "median personal threshold, its CI and the spread appear here by "
                        "themselves when it is done.")
            headline(done, summary, settings, report_boot)

        pending()
    binned = binned_rate(cyc.assign(sw=cyc["switched"].astype(float)), wait_col, "sw",
                         n_bins=12)
    pts = alt.Chart(binned).mark_point(filled=True, color="black").encode(
        x=alt.X("wait_s:Q", scale=alt.Scale(type="log"), title=WAITS[wait_col] + " (s)"),
        y=alt.Y("p:Q", title="P(switch during the wait)", axis=ui.RATE_AXIS),
        tooltip=[alt.Tooltip("wait_s:Q", format=".2f"), "n", "k",
                 alt.Tooltip("p:Q", format=".1%"), alt.Tooltip("lo:Q", format=".1%"),
                 alt.Tooltip("hi:Q", format=".1%")])
    err = alt.Chart(binned).mark_rule(color="black").encode(x="wait_s:Q", y="lo:Q", y2="hi:Q")
    layers = [err, pts]
    if res is not None:
        cv = curves(cyc, res)
        band = alt.Chart(cv.dropna(subset=["lo"])).mark_area(opacity=0.2).encode(
            x="wait_s:Q", y="lo:Q", y2="hi:Q", color=alt.Color("model:N"))
        line = alt.Chart(cv).mark_line().encode(
            x="wait_s:Q", y="p:Q", color=alt.Color("model:N", title="fitted"),
            tooltip=["model", alt.Tooltip("wait_s:Q", format=".2f"),
                     alt.Tooltip("p:Q", format=".1%")])
        layers = [band, line, *layers]
        med = pt.get("median_psi_s")
        if med and pt.get("found"):  # no ψ line without a reported threshold
            layers.append(alt.Chart(pd.DataFrame({"psi_s": [med]})).mark_rule(
                strokeDash=[4, 4]).encode(x="psi_s:Q", tooltip=[alt.Tooltip(
                    "psi_s:Q", format=".2f", title="median personal ψ (s)")]))
        data_out = pd.concat([cv.assign(kind="fitted curve"),
                              binned.assign(kind="binned rate", model=None)], ignore_index=True)
    else:
        data_out = binned.assign(kind="binned rate")
    ui.chart(alt.layer(*layers).properties(height=380), data_out, "switch vs wait")
    st.caption("Points: observed switch rate in wait bins with 95 % Wilson intervals. Lines: "
               "hinge and smooth logistic fits with pointwise bootstrap bands "
               f"({settings.n_boot} replicates, seed {settings.seed}; the report uses "
               f"{report_boot}).")

    st.subheader("Per participant")
    per = []
    few = 0
    for pid, g in cyc.groupby("participant_id"):
        b = binned_rate(g.assign(sw=g["switched"].astype(float)), wait_col, "sw", n_bins=6)
        # A curve needs enough waits spread over a few bins; fewer is a dot, not a curve.
        if g[wait_col].notna().sum() < MIN_CURVE_WAITS or len(b) < 3:
            few += 1
            continue
        per.append(b.assign(participant_id=pid))
    if few:
        st.caption(f"{few} participant(s) with fewer than {MIN_CURVE_WAITS} waits (or waits "
                   "in fewer than 3 bins) are not drawn: their curve would be a dot.")
    if not per:
        st.info("—: no participant has enough waits for a curve of their own yet.")
        return
    per_df = pd.concat(per, ignore_index=True)
    ch = alt.Chart(per_df).mark_line(point=True, opacity=0.5).encode(
        x=alt.X("wait_s:Q", scale=alt.Scale(type="log"), title=WAITS[wait_col] + " (s)"),
        y=alt.Y("p:Q", title="P(switch)", axis=ui.RATE_AXIS),
        color=alt.Color("participant_id:N", legend=None),
        tooltip=["participant_id", alt.Tooltip("wait_s:Q", format=".2f"), "n",
                 alt.Tooltip("p:Q", format=".1%")]).properties(height=300)
    ui.chart(ch, per_df, "per-participant switch curves")


if not ui.no_cycles(ctx, "The switch-vs-wait curve"):
    table = compute.switch_table(ctx.url, ctx.fresh)
    if table is not None and ctx.n_cycles <= compute.SYNC_CYCLES:
        show(table)
    else:
        @st.fragment(run_every=2.0)
        def pending() -> None:
            t = compute.switch_table(ctx.url, ctx.fresh, block=False)
            if t is None:
                st.info(f"Classifying context switches over {ctx.n_cycles:,} cycles with the "
                        "analysis layer; the curve appears here by itself in a few seconds.")
            else:
                show(t)

        pending()
