"""Figures of the `flowtrial analyze` report (matplotlib, embedded as base64 PNG).

Each function returns a ``data:image/png;base64,…`` URI, or None when there is nothing to
draw, so the HTML template can embed it directly and the report stays one file.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import numpy as np
import pandas as pd

from .report_sections import MIN_WAITS_PER_CURVE, analysable, binned_rate, switch_analysable

MAX_POINTS = 4000  # scatter plots are thinned to this many points
MAX_PARTICIPANTS = 30  # small multiples


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display: figures only go to files
    import matplotlib.pyplot as plt

    return plt


def _uri(fig: Any, tight: bool = True) -> str:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _colors(names: list[str]) -> dict[str, Any]:
    cmap = _plt().get_cmap("tab10")
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def switch_vs_wait(cycles: pd.DataFrame, wait_col: str, switch_col: str, result: Any,
                   wait_label: str, true_psi: float | None = None,
                   reported: tuple[float, float, float] | None = None) -> str | None:
    """P(switch) vs wait: binned points with Wilson CIs, the pooled hinge and smooth fits with
    the hinge's bootstrap band, the reported threshold (median personal ψ, CI) only when the
    report reports one, and the true ψ when known; none without focus capture."""
    df = switch_analysable(cycles, wait_col)
    if len(df) < 5:
        return None
    plt = _plt()
    pts = binned_rate(df, wait_col, switch_col, n_bins=12)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    yerr = np.clip(np.vstack([pts["p"] - pts["lo"], pts["hi"] - pts["p"]]), 0, None)
    ax.errorbar(pts["wait_s"], pts["p"], yerr=yerr, fmt="o", color="black", ms=4,
                capsize=2, label="observed (binned, 95 % CI)")
    w = df[wait_col].to_numpy(float)
    if result is not None:
        grid = np.exp(np.linspace(np.log(w.min()), np.log(w.max()), 200))
        curve = result.curve(grid)
        if "hinge_lo" in curve:
            ax.fill_between(grid, curve["hinge_lo"], curve["hinge_hi"], color="tab:blue",
                            alpha=0.18, label="pooled hinge, bootstrap 95 % band")
        ax.plot(grid, curve["hinge"], color="tab:blue", lw=2, label="pooled hinge fit")
        ax.plot(grid, curve["smooth"], color="tab:orange", lw=1.5, ls="--",
                label="smooth logistic fit")
    if reported is not None:
        psi, lo, hi = reported
        ax.axvspan(lo, hi, color="tab:green", alpha=0.08)
        ax.axvline(psi, color="tab:green", lw=1,
                   label=f"median personal ψ = {psi:.3g} s (95 % CI {lo:.3g}–{hi:.3g} s)")
    if true_psi:
        ax.axvline(true_psi, color="tab:red", lw=1, ls=":", label=f"true ψ = {true_psi:.3g} s")
    ax.set_xscale("log")
    ax.set_xlabel(f"{wait_label} (s, log scale)")
    ax.set_ylabel("P(context switch during the wait)")
    ax.set_ylim(0, min(1.0, max(0.2, float(pts["hi"].max()) * 1.15)))
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    return _uri(fig)


def wait_distributions(cycles: pd.DataFrame) -> str | None:
    """Histograms of idle wait, total wait and experienced TTFT per arm (log scale)."""
    cols = [("idle_wait_s", "idle wait"), ("total_wait_s", "total wait"),
            ("experienced_ttft_s", "experienced TTFT")]
    ok = analysable(cycles, "total_wait_s")
    if ok.empty:
        return None
    plt = _plt()
    arms = sorted(ok["arm"].astype(str).unique())
    colors = _colors(arms)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), sharey=False)
    for ax, (col, label) in zip(axes, cols, strict=True):
        v = ok[col].to_numpy(float)
        v = v[np.isfinite(v) & (v > 0)]
        if v.size == 0:
            ax.set_visible(False)
            continue
        bins = np.exp(np.linspace(np.log(v.min()), np.log(v.max()) + 1e-9, 30))
        for arm in arms:
            a = ok.loc[ok["arm"].astype(str) == arm, col].to_numpy(float)
            a = a[np.isfinite(a) & (a > 0)]
            ax.hist(a, bins=bins, histtype="step", lw=1.5, color=colors[arm], label=arm)
        ax.set_xscale("log")
        ax.set_xlabel(f"{label} (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cycles")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return _uri(fig)


def manipulation(cycles: pd.DataFrame, seed: int = 0) -> str | None:
    """Target vs achieved: TTFT and tokens/s per cycle, coloured by arm, with y = x."""
    ok = cycles[(cycles["status"].astype(str) == "ok").to_numpy()]
    pairs = [("target_ttft_s", "experienced_ttft_s", "TTFT (s)"),
             ("target_tps", "achieved_tps", "tokens/s")]
    usable = [p for p in pairs if ok[p[0]].notna().any() and ok[p[1]].notna().any()]
    if ok.empty or not usable:
        return None
    if len(ok) > MAX_POINTS:
        ok = ok.sample(MAX_POINTS, random_state=seed)
    plt = _plt()
    arms = sorted(ok["arm"].astype(str).unique())
    colors = _colors(arms)
    fig, axes = plt.subplots(1, len(usable), figsize=(5 * len(usable), 3.6), squeeze=False)
    for ax, (tcol, acol, label) in zip(axes[0], usable, strict=True):
        x, y = ok[tcol].to_numpy(float), ok[acol].to_numpy(float)
        m = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        for arm in arms:
            a = m & (ok["arm"].astype(str) == arm).to_numpy()
            ax.scatter(x[a], y[a], s=6, alpha=0.5, color=colors[arm], label=arm)
        if m.any():
            lo, hi = min(x[m].min(), y[m].min()), max(x[m].max(), y[m].max())
            ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="achieved = target")
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"target {label}")
        ax.set_ylabel(f"achieved {label}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _uri(fig)


def participants(cycles: pd.DataFrame, wait_col: str, switch_col: str,
                 true_psi: dict[str, float] | None = None, psi_hat: float | None = None
                 ) -> str | None:
    """Small multiples: each participant's binned switch rate against the wait, for those
    with enough measured waits to draw a curve (:data:`MIN_WAITS_PER_CURVE`)."""
    df = switch_analysable(cycles, wait_col)
    counts = df["participant_id"].value_counts()
    pids = sorted(counts[counts >= MIN_WAITS_PER_CURVE].index)[:MAX_PARTICIPANTS]
    if not pids:
        return None
    n = len(pids)
    ncol = min(6, n)
    nrow = math.ceil(n / ncol)
    plt = _plt()
    # Linear axes on log10(wait) with fixed ticks: log-scale axes make matplotlib compute
    # minor ticks for every panel, which costs seconds for 30 panels.
    fig, axes = plt.subplots(nrow, ncol, figsize=(1.9 * ncol, 1.5 * nrow + 0.5), sharex=True,
                             sharey=True, squeeze=False)
    lw_all = np.log10(df[wait_col].to_numpy(float))
    lo, hi = math.floor(lw_all.min()), math.ceil(lw_all.max())
    ticks = list(range(lo, hi + 1))
    for ax, pid in zip(axes.ravel(), pids, strict=False):
        g = df[df["participant_id"] == pid]
        pts = binned_rate(g, wait_col, switch_col, n_bins=5)
        ax.plot(np.log10(pts["wait_s"]), pts["p"], "o-", ms=3, lw=1, color="black")
        if psi_hat:
            ax.axvline(math.log10(psi_hat), color="tab:green", lw=0.8)
        if true_psi and pid in true_psi:
            ax.axvline(math.log10(true_psi[pid]), color="tab:red", lw=0.8, ls=":")
        ax.set_title(f"{pid} (n={len(g)})", fontsize=7, pad=2)
    ax0 = axes[0, 0]
    ax0.set_xlim(lo - 0.1, hi + 0.1)
    ax0.set_xticks(ticks, [f"{10.0 ** t:g}" for t in ticks])
    ax0.set_ylim(-0.02, 1.02)
    ax0.set_yticks([0, 0.5, 1])
    for ax in axes.ravel():
        ax.tick_params(labelsize=6)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.text(0.5, 0.01, f"{wait_col} (s, log scale)", ha="center", fontsize=8)
    fig.text(0.005, 0.5, "P(switch)", va="center", rotation="vertical", fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.12 if nrow < 3 else 0.06, top=0.95,
                        wspace=0.08, hspace=0.45)
    return _uri(fig, tight=False)
