"""Context-switch classification on focus-event timelines (docs/concepts/timeline.md,
docs/concepts/capture.md).

A **context switch during a wait** is an *away episode* — foreground focus outside the
participant's working apps — whose first not-AFK moment lies between ``t_request`` and
``t_last_sent`` and whose not-AFK duration is at least ``min_away_s`` real seconds. The
episode may outlast the wait (a switch straddling ``t_last_sent`` counts, with its whole
duration); an episode that began before the request does not (focus did not leave during
the wait).

Timelines
    Focus events have kind ``focus_out`` (payload ``app``, ``category``: where focus went)
    or ``focus_in`` (focus back in a working app). A ``focus_out`` whose ``app`` is itself a
    working app (e.g. editor → terminal) is not away. Episodes run from the first away event
    to the next non-away event of the same participant; an episode with no recorded return
    is closed at the participant's last observed timestamp.

AFK
    ``afk_start``/``afk_end`` pairs give AFK intervals; intervals from *both* sources are
    united (either source saying "away from keyboard" excludes that time). AFK time is
    subtracted from an episode's duration, and an episode that starts while AFK starts when
    the AFK interval ends.

Precedence of sources (client vs ActivityWatch)
    Client events (source ``client``/``page``/``simulator`` etc.) are exact; ActivityWatch
    ones (source ``activitywatch``) are polled. For each cycle the classification uses the
    client timeline when the participant has at least one client focus event within
    ``coverage_s`` real seconds of the wait window (the client was running then), otherwise
    the ActivityWatch timeline if it has events there, otherwise whichever source the
    participant has at all (client first). Sources are never mixed within one cycle, so an
    episode is never double-counted.

Everything is vectorized (sorted arrays and ``pandas.merge_asof``), so 100,000 cycles take
well under a second. Times are raw UTC epoch ns; durations are multiplied by ``time_scale``
to give real seconds, and ``min_away_s``/``coverage_s`` are real seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.app_categories import normalize_app

NS = 1_000_000_000
AW_SOURCE = "activitywatch"
FOCUS_KINDS = ("focus_out", "focus_in")
AFK_KINDS = ("afk_start", "afk_end")
DEFAULT_SENSITIVITY_S = (2.0, 10.0, 30.0)


def switch_column(min_away_s: float) -> str:
    """Column name of the switch flag at a threshold, e.g. ``switched_10s``."""
    return f"switched_{min_away_s:g}s"


def _away_flags(
    ev: pd.DataFrame,
    working_apps: Iterable[str],
    participant_working_apps: Mapping[str, Sequence[str]] | None,
) -> np.ndarray:
    """True where the event leaves focus outside the working apps."""
    default = {normalize_app(a) for a in working_apps} - {None}
    apps = ev["app"].map(normalize_app) if "app" in ev.columns else pd.Series(None, index=ev.index)
    is_out = (ev["kind"] == "focus_out").to_numpy()
    in_work = np.array(apps.isin(default).to_numpy(), dtype=bool)  # writable copy
    if participant_working_apps:
        for pid, lst in participant_working_apps.items():
            rows = (ev["participant_id"] == pid).to_numpy()
            if rows.any():
                own = {normalize_app(a) for a in lst} - {None}
                in_work[rows] = apps[rows].isin(own).to_numpy()
    return is_out & ~in_work


def _runs(df: pd.DataFrame, flag: np.ndarray) -> pd.DataFrame:
    """Maximal runs of ``flag`` per participant in a (participant, ts)-sorted frame.

    Returns one row per True run: participant_id, start (ns), end (ns of the first event of
    the next run of the same participant, or -1 if none), category, app.
    """
    if df.empty:
        return pd.DataFrame(
            {"participant_id": pd.Series([], dtype=object), "start": np.array([], np.int64),
             "end": np.array([], np.int64), "category": pd.Series([], dtype=object),
             "app": pd.Series([], dtype=object)}
        )
    pid = df["participant_id"].to_numpy()
    ts = df["ts_ns"].to_numpy(np.int64)
    new_pid = np.r_[True, pid[1:] != pid[:-1]]
    change = new_pid | np.r_[True, flag[1:] != flag[:-1]]
    first = np.flatnonzero(change)  # first row of every run
    run_pid = pid[first]
    run_flag = flag[first]
    run_start = ts[first]
    nxt_start = np.r_[run_start[1:], -1]
    nxt_same = np.r_[run_pid[1:] == run_pid[:-1], False]
    run_end = np.where(nxt_same, nxt_start, -1)
    cat = df["category"].to_numpy(object) if "category" in df.columns else np.full(len(df), None)
    app = df["app"].to_numpy(object) if "app" in df.columns else np.full(len(df), None)
    keep = run_flag.astype(bool)
    return pd.DataFrame(
        {
            "participant_id": run_pid[keep],
            "start": run_start[keep],
            "end": run_end[keep],
            "category": cat[first][keep],
            "app": app[first][keep],
        }
    )


def _sorted_events(events: pd.DataFrame, kinds: Sequence[str]) -> pd.DataFrame:
    ev = events[events["kind"].isin(kinds)]
    return ev.sort_values(["participant_id", "ts_ns"], kind="stable").reset_index(drop=True)


def afk_intervals(events: pd.DataFrame, last_ns: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Merged AFK intervals per participant (union over sources).

    Columns: participant_id, start, end (ns), cum_before (AFK ns of earlier intervals of the
    same participant). An ``afk_start`` with no ``afk_end`` runs to ``last_ns[participant]``.
    """
    parts = []
    for _src, ev in events[events["kind"].isin(AFK_KINDS)].groupby("source", sort=False):
        ev = _sorted_events(ev, AFK_KINDS)
        runs = _runs(ev, (ev["kind"] == "afk_start").to_numpy())
        parts.append(runs[["participant_id", "start", "end"]])
    if not parts:
        return pd.DataFrame({"participant_id": pd.Series([], dtype=object),
                             "start": np.array([], np.int64), "end": np.array([], np.int64),
                             "cum_before": np.array([], np.int64)})
    iv = pd.concat(parts, ignore_index=True)
    open_ = iv["end"] < 0
    if open_.any():
        fill = iv.loc[open_, "participant_id"].map(last_ns or {}).fillna(0).astype(np.int64)
        iv.loc[open_, "end"] = np.maximum(fill.to_numpy(), iv.loc[open_, "start"].to_numpy())
    iv = iv.sort_values(["participant_id", "start"], kind="stable").reset_index(drop=True)
    # Union of overlapping intervals: a new group starts where the start lies beyond every
    # earlier end of the same participant.
    run_max = iv.groupby("participant_id", sort=False)["end"].cummax()
    prev_max = run_max.groupby(iv["participant_id"], sort=False).shift(1)
    new = prev_max.isna() | (iv["start"] > prev_max)
    grp = new.cumsum()
    merged = iv.groupby(grp, sort=False).agg(
        participant_id=("participant_id", "first"), start=("start", "min"), end=("end", "max")
    ).reset_index(drop=True)
    length = merged["end"] - merged["start"]
    merged["cum_before"] = length.groupby(merged["participant_id"], sort=False).cumsum() - length
    return merged


def _asof(
    left: pd.DataFrame, on: str, right: pd.DataFrame, right_on: str, direction: str
) -> pd.DataFrame:
    """merge_asof by participant keeping ``left``'s row order (``_row`` column)."""
    # Same key dtypes on both sides (pandas 3 infers str columns as StringDtype).
    left = left.astype({"participant_id": object})
    right = right.astype({"participant_id": object})
    lsorted = left.sort_values(on, kind="stable")
    rsorted = right.sort_values(right_on, kind="stable")
    if rsorted.empty:
        out = lsorted.copy()
        for c in rsorted.columns:
            if c != "participant_id":
                out[c] = np.nan
        return out.sort_index()
    out = pd.merge_asof(
        lsorted, rsorted, left_on=on, right_on=right_on, by="participant_id",
        direction=direction, allow_exact_matches=True,
    )
    out.index = lsorted.index
    return out.sort_index()


def afk_cumulative(afk: pd.DataFrame, pid: pd.Series, t_ns: np.ndarray) -> np.ndarray:
    """C(t): AFK ns of participant ``pid`` before time ``t`` (int64 ns times)."""
    t = np.asarray(t_ns, dtype=np.int64)
    if afk.empty or t.size == 0:
        return np.zeros(t.size)
    q = pd.DataFrame({"participant_id": np.asarray(pid, dtype=object), "t": t})
    r = afk.rename(columns={"start": "a_start", "end": "a_end"})
    m = _asof(q, "t", r, "a_start", "backward")
    has = m["a_start"].notna().to_numpy()
    a_start = m["a_start"].fillna(0).to_numpy(np.int64)
    a_end = m["a_end"].fillna(0).to_numpy(np.int64)
    cum = m["cum_before"].fillna(0).to_numpy(np.int64)
    inside = np.clip(t - a_start, 0, a_end - a_start)
    return np.where(has, cum + inside, 0).astype(float)


def away_episodes(
    focus: pd.DataFrame,
    afk: pd.DataFrame,
    working_apps: Iterable[str],
    participant_working_apps: Mapping[str, Sequence[str]] | None = None,
    last_ns: Mapping[str, int] | None = None,
) -> pd.DataFrame:
    """Away episodes of one source's focus timeline, with AFK removed.

    Columns: participant_id, start (first away event, ns), end (return, ns), eff_start
    (first not-AFK moment, ns), whole_afk (True if the episode was AFK throughout: it can
    never count as a switch), away_ns (not-AFK duration), category (payload category, else
    the app).
    """
    ev = _sorted_events(focus, FOCUS_KINDS)
    runs = _runs(ev, _away_flags(ev, working_apps, participant_working_apps))
    open_ = runs["end"] < 0
    if open_.any():
        fill = runs.loc[open_, "participant_id"].map(last_ns or {}).fillna(0).astype(np.int64)
        runs.loc[open_, "end"] = np.maximum(fill.to_numpy(), runs.loc[open_, "start"].to_numpy())
    runs["category"] = runs["category"].where(runs["category"].notna(), runs["app"])
    start = runs["start"].to_numpy(np.int64)
    end = runs["end"].to_numpy(np.int64)
    eff = start.copy()
    pid = runs["participant_id"].to_numpy(object)
    if not afk.empty and len(runs):
        # An episode starting inside an AFK interval starts (for us) when that interval ends.
        q = pd.DataFrame({"participant_id": pid, "t": start})
        m = _asof(q, "t", afk.rename(columns={"start": "a_start", "end": "a_end"}),
                  "a_start", "backward")
        a_end = m["a_end"].fillna(-1).to_numpy(np.int64)
        eff = np.where(a_end > start, a_end, start)
    whole_afk = eff >= end
    eff = np.minimum(eff, end)
    afk_in = afk_cumulative(afk, pid, end) - afk_cumulative(afk, pid, eff)
    runs["eff_start"] = eff
    runs["whole_afk"] = whole_afk
    runs["away_ns"] = np.where(whole_afk, 0.0, (end - eff) - afk_in)
    return runs


def _first_in_window(
    cyc: pd.DataFrame, eps: pd.DataFrame, min_away_ns: float
) -> pd.DataFrame:
    """For each cycle: the first episode with away_ns >= min_away_ns whose effective start
    lies in [t_request, t_last_sent]; columns hit, category, away_ns, end."""
    q = eps[(eps["away_ns"] >= min_away_ns) & ~eps["whole_afk"]]
    q = q.rename(columns={"eff_start": "eff"})[["participant_id", "eff", "category",
                                                 "away_ns", "end"]]
    left = cyc[["participant_id", "r", "l"]]
    out = pd.DataFrame(index=left.index)
    if q.empty:
        out["hit"] = False
        out["category"] = None
        out["away_ns"] = 0.0
        out["end"] = np.nan
        return out
    m = _asof(left, "r", q, "eff", "forward")
    found = m["eff"].notna().to_numpy()
    eff = m["eff"].fillna(0).to_numpy(np.int64)
    hit = found & (eff <= m["l"].to_numpy(np.int64))
    out["hit"] = hit
    out["category"] = np.where(hit, m["category"].to_numpy(object), None)
    out["away_ns"] = np.where(hit, m["away_ns"].to_numpy(float), 0.0)
    out["end"] = np.where(hit, m["end"].to_numpy(float), np.nan)
    return out


def _has_event_near(cyc: pd.DataFrame, ev: pd.DataFrame, margin_ns: int) -> np.ndarray:
    """True where the participant has an event in [r − margin, l + margin]."""
    if ev.empty:
        return np.zeros(len(cyc), bool)
    q = pd.DataFrame({"participant_id": cyc["participant_id"].to_numpy(object),
                      "t": (cyc["l"] + margin_ns).to_numpy(np.int64)}, index=cyc.index)
    r = ev[["participant_id", "ts_ns"]]
    m = _asof(q, "t", r, "ts_ns", "backward")
    return m["ts_ns"].notna().to_numpy() & (
        m["ts_ns"].fillna(0).to_numpy(np.int64) >= (cyc["r"] - margin_ns).to_numpy(np.int64)
    )


def classify_switches(
    cycles: pd.DataFrame,
    focus_events: pd.DataFrame,
    min_away_s: float,
    working_apps: Iterable[str],
    *,
    sensitivity_s: Sequence[float] = DEFAULT_SENSITIVITY_S,
    time_scale: float = 1.0,
    participant_working_apps: Mapping[str, Sequence[str]] | None = None,
    coverage_s: float = 600.0,
) -> pd.DataFrame:
    """Classify every cycle's wait as switched or not (see the module docstring).

    ``cycles``: ``cycle_id``, ``participant_id``, ``t_request_wall_ns``,
    ``t_last_sent_wall_ns`` (UTC epoch ns; a missing last-sent time gives NaN/False).
    ``focus_events``: ``participant_id``, ``kind`` (focus_out/focus_in/afk_start/afk_end),
    ``ts_ns``, ``source``, optional ``app`` and ``category``.

    Returns one row per cycle, in the input order, with ``cycle_id``; ``switched`` (at
    ``min_away_s``); ``switched_<m>s`` for each sensitivity threshold; ``switch_category``;
    ``time_away_s`` (not-AFK duration of the switch, 0 if none); ``resumption_lag_s`` (from
    t_last_sent to the return to a working app after a switch, 0 if none or if the return
    came before t_last_sent); ``afk_overlap_s`` (AFK time inside the wait);
    ``switch_source`` (the timeline used: client, activitywatch or none). Seconds are real
    (raw × ``time_scale``).
    """
    scale = float(time_scale)
    thresholds = sorted({float(min_away_s), *map(float, sensitivity_s)})
    r_ns = pd.array(cycles["t_request_wall_ns"], dtype="Int64")
    l_ns = pd.array(cycles["t_last_sent_wall_ns"], dtype="Int64")
    valid = ~(pd.isna(r_ns) | pd.isna(l_ns))
    valid = np.asarray(valid, dtype=bool)
    cyc = pd.DataFrame(
        {
            "participant_id": cycles["participant_id"].to_numpy(object),
            "r": r_ns.fillna(0).to_numpy(np.int64),
            "l": l_ns.fillna(0).to_numpy(np.int64),
        }
    )
    out = pd.DataFrame(index=cyc.index)
    out["cycle_id"] = cycles["cycle_id"].to_numpy()

    ev = focus_events
    if ev is None or len(ev) == 0:
        ev = pd.DataFrame({"participant_id": pd.Series([], dtype=object),
                           "kind": pd.Series([], dtype=object), "ts_ns": np.array([], np.int64),
                           "source": pd.Series([], dtype=object)})
    ev = ev.copy()
    ev["participant_id"] = ev["participant_id"].astype(object)
    ev["ts_ns"] = pd.to_numeric(ev["ts_ns"]).astype(np.int64)
    if "source" not in ev.columns:
        ev["source"] = "client"
    ev["source"] = ev["source"].fillna("client").astype(object)
    # Last observed time per participant closes open episodes / AFK intervals.
    last = pd.concat(
        [ev[["participant_id", "ts_ns"]].rename(columns={"ts_ns": "t"}),
         cyc.loc[valid, ["participant_id", "l"]].rename(columns={"l": "t"})]
    ).groupby("participant_id")["t"].max()
    last_ns = {k: int(v) for k, v in last.items()}

    afk = afk_intervals(ev, last_ns)
    cv = cyc[valid]
    focus = ev[ev["kind"].isin(FOCUS_KINDS)]
    is_aw = (focus["source"] == AW_SOURCE).to_numpy()
    sources = {"client": focus[~is_aw], AW_SOURCE: focus[is_aw]}
    margin = int(coverage_s / scale * NS)

    # Source per cycle: client when it covers the window, else ActivityWatch, else whichever
    # the participant has (client first).
    near = {k: _has_event_near(cv, s, margin) for k, s in sources.items()}
    has_any = {k: cv["participant_id"].isin(set(s["participant_id"])).to_numpy()
               for k, s in sources.items()}
    chosen = np.where(
        near["client"], "client",
        np.where(near[AW_SOURCE], AW_SOURCE,
                 np.where(has_any["client"], "client",
                          np.where(has_any[AW_SOURCE], AW_SOURCE, "none"))),
    )

    res = {
        f"t{m:g}": np.zeros(len(cv), bool) for m in thresholds
    }
    category = np.full(len(cv), None, dtype=object)
    away_s = np.zeros(len(cv))
    lag_s = np.zeros(len(cv))
    for name, src in sources.items():
        use = chosen == name
        if not use.any() or src.empty:
            continue
        eps = away_episodes(src, afk, working_apps, participant_working_apps, last_ns)
        sub = cv[use]
        for m in thresholds:
            hit = _first_in_window(sub, eps, m / scale * NS)
            res[f"t{m:g}"][use] = hit["hit"].to_numpy()
            if m == float(min_away_s):
                main = hit
        h = main["hit"].to_numpy()
        category[use] = main["category"].to_numpy(object)
        away_s[use] = main["away_ns"].to_numpy(float) / NS * scale
        # Resumption lag: from t_last_sent to the return that ends the *counted* switch (a
        # later short blip across t_last_sent is not the switch, so it gives no lag).
        end = main["end"].to_numpy(float)
        lv = sub["l"].to_numpy(np.int64).astype(float)
        lag = np.where(h & (np.nan_to_num(end, nan=-1.0) > lv), (end - lv) / NS * scale, 0.0)
        lag_s[use] = lag

    n = len(cyc)

    def full(values: np.ndarray, fill: Any, dtype: Any = None) -> np.ndarray:
        arr = np.full(n, fill, dtype=dtype if dtype is not None else np.asarray(values).dtype)
        arr[valid] = values
        return arr

    out["switched"] = full(res[f"t{float(min_away_s):g}"], False, bool)
    for m in thresholds:
        out[switch_column(m)] = full(res[f"t{m:g}"], False, bool)
    out["switch_category"] = full(category, None, object)
    out["time_away_s"] = full(away_s, np.nan, float)
    out["resumption_lag_s"] = full(lag_s, np.nan, float)
    afk_wait = (
        afk_cumulative(afk, cv["participant_id"], cv["l"].to_numpy(np.int64))
        - afk_cumulative(afk, cv["participant_id"], cv["r"].to_numpy(np.int64))
    ) / NS * scale
    out["afk_overlap_s"] = full(afk_wait, np.nan, float)
    out["switch_source"] = full(chosen.astype(object), None, object)
    return out.reset_index(drop=True)
