"""What every page shares: which database, its freshness, the filters, charts with a CSV
download, and the empty state of a study that has no cycles yet."""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from . import data, filters
from .filters import Filters

DB_ENV = "FLOWTRIAL_DASHBOARD_DB"


def db_from_args(argv: list[str] | None = None) -> str | None:
    """``--db`` from the script arguments (``streamlit run app.py -- --db X``), else the
    ``FLOWTRIAL_DASHBOARD_DB`` environment variable (what ``flowtrial dashboard`` sets)."""
    import sys

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--db")
    known, _ = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.db or os.environ.get(DB_ENV) or None


@dataclass
class Context:
    url: str
    fresh: tuple[int, ...]
    info: data.StudyInfo
    options: dict[str, Any]
    filters: Filters

    @property
    def n_cycles(self) -> int:
        return self.fresh[0]

    @property
    def scale(self) -> float:
        return self.info.time_scale


def context() -> Context:
    """Database, freshness token, study facts and the sidebar filters (set up by app.py)."""
    url = st.session_state["flowtrial_db_url"]
    fresh = data.freshness(url)
    info = data.study_info(url, fresh)
    options = data.filter_options(url, fresh)
    f = filters.sidebar(options)
    with st.sidebar:
        st.caption(f"Study **{info.name}** · {info.design} design · {fresh[0]:,} cycles")
    return Context(url=url, fresh=fresh, info=info, options=options, filters=f)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "data"


def download(df: pd.DataFrame, name: str) -> None:
    """A CSV download of exactly the data behind a chart or table."""
    st.download_button(f"Download data (CSV): {name}", df.to_csv(index=False).encode(),
                       file_name=f"flowtrial-{_slug(name)}.csv", mime="text/csv",
                       key=f"dl-{_slug(name)}", on_click="ignore")


#: A rate's axis: whole percents at least 1 % apart (Vega's automatic precision printed
#: "0.000000%" for tiny domains and repeated labels for narrow ones).
RATE_AXIS = alt.Axis(format=".0%", tickMinStep=0.01)
#: A count's axis: integers only (no ".900 .900" ticks when every count is 1).
COUNT_AXIS = alt.Axis(format="d", tickMinStep=1)


#: What ``st.altair_chart`` draws: any top-level Altair chart.
AltairChart = (alt.Chart | alt.LayerChart | alt.FacetChart | alt.HConcatChart | alt.VConcatChart
               | alt.ConcatChart | alt.RepeatChart)


def chart(ch: AltairChart, df: pd.DataFrame, name: str) -> None:
    """An Altair chart (hover tooltips are set by the caller) and its data's download."""
    st.altair_chart(ch, width="stretch")
    download(df, name)


def is_rate(column: str) -> bool:
    """Columns holding a fraction in [0, 1], shown as percentages like the report's."""
    return column.endswith(("_rate", "_share")) or column in ("rate", "share")


def displayed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as the page shows it: rates as "18.5 %" (the report's format); the CSV download
    keeps the raw fractions."""
    out = df.copy()
    for c in out.columns:
        if is_rate(str(c)) and pd.api.types.is_numeric_dtype(out[c]):
            out[c] = [pct(v) for v in out[c]]
    return out


def table(df: pd.DataFrame, name: str) -> None:
    st.dataframe(displayed(df), hide_index=True)
    download(df, name)


def no_cycles(ctx: Context, what: str) -> bool:
    """Show the empty state when the study (or the filter) has no cycles; True if shown."""
    if ctx.n_cycles == 0:
        facts = data.enrolled_without_cycles(ctx.url)
        st.info(
            f"No cycles recorded yet — {facts['participants']} participant(s) enrolled, "
            f"{facts['assignments']} assignment(s). {what} appears once participants' "
            "assistants send requests through the proxy (`flowtrial proxy`), or after "
            "`flowtrial simulate` adds simulated participants. This page refreshes with "
            "the data."
        )
        return True
    return False


def nothing_matches(df: pd.DataFrame, ctx: Context) -> bool:
    if len(df):
        return False
    st.warning("No cycles match the filters: widen the date range or clear the filters "
               "in the sidebar." if ctx.filters.active else "No data for this view yet.")
    return True


def _missing(x: Any) -> bool:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return True
    return not math.isfinite(v)


def fmt(x: Any, spec: str = ".3g", unit: str = "") -> str:
    """``x`` with ``spec`` and ``unit``, or "—" when there is no number."""
    if _missing(x):
        return "—"
    return f"{float(x):{spec}}{unit}"


def num(x: Any, unit: str = "", digits: int = 3) -> str:
    """A number the way the report prints it (``analysis.report._fmt``): ``digits``
    significant digits, thousands in full (8,000, not 8e+03); "—" when missing."""
    if _missing(x):
        return "—"
    v = float(x)
    text = f"{v:,.0f}" if abs(v) >= 10 ** digits else f"{v:.{digits}g}"
    return f"{text}{unit}"


def ci(bounds: Any, unit: str = "", digits: int = 3) -> str:
    """A 95 % interval as "1.28–8.66 s", or "not estimated" when a bound is missing (never
    "—–— s")."""
    lo, hi = (list(bounds) + [None, None])[:2] if bounds is not None else (None, None)
    if _missing(lo) or _missing(hi):
        return "not estimated"
    return f"{num(lo, digits=digits)}–{num(hi, digits=digits)}{unit}"


def pct(x: Any) -> str:
    """A fraction as the report's percentage ("18.5 %"); "—" when missing."""
    return "—" if _missing(x) else f"{100 * float(x):.1f} %"
