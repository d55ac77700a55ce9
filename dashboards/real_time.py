"""A compressed study's clock in real time (docs/concepts/timeline.md#real-and-compressed-time).

The database keeps raw wall times; with ``time_scale`` = s a raw second is s real seconds of
the participants' work. A timeline is stretched from its first moment t0: t → t0 + (t − t0)·s,
so each bar is as long as the real duration the analysis reports. Labels are 24-hour UTC,
with the date when the range crosses a day.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

__all__ = ["axis_format", "in_real_time", "utc_label"]


def in_real_time(frame: pd.DataFrame, scale: float,
                 columns: Sequence[str] = ("start", "end")) -> pd.DataFrame:
    """``frame`` with its UTC timestamp ``columns`` stretched by ``scale`` from their
    earliest value (unchanged at scale 1 or when empty)."""
    cols = [c for c in columns if c in frame.columns]
    if scale == 1 or frame.empty or not cols:
        return frame
    t0 = min(frame[c].min() for c in cols)
    out = frame.copy()
    for c in cols:
        out[c] = t0 + (out[c] - t0) * float(scale)
    return out


def axis_format(lo: pd.Timestamp, hi: pd.Timestamp) -> str:
    """A 24-hour d3 time format for an axis from ``lo`` to ``hi`` (UTC): seconds for a span
    under ten minutes, the date as well when the span crosses a day."""
    fmt = "%H:%M:%S" if hi - lo < pd.Timedelta(minutes=10) else "%H:%M"
    return fmt if lo.normalize() == hi.normalize() else f"%Y-%m-%d {fmt}"


def utc_label(t: pd.Series, with_date: bool) -> pd.Series:
    """Timestamps as 24-hour UTC text (for tooltips, which Vega would show in local time)."""
    return t.dt.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")
