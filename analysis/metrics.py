"""The metrics layer: a study database → documented per-cycle and per-task DataFrames.

Every duration is in **real seconds**: the database stores raw durations, and a study run
with ``time_scale`` > 1 (compressed time, for pilots and demos) has them multiplied back by
``time_scale``; rates (tokens/s) are divided by it. Wall times are UTC.

``cycle_table`` columns (one row per cycle, ordered by participant and request time):

=====================  ====================================================================
cycle_id               the proxy's cycle id
participant_id         pseudonymous participant
arm                    arm name (``per_prompt`` for per-prompt designs)
period, task_id        crossover period and task, when known
protocol, status       wire protocol (chat/completions/responses/messages); ok/error/…
started_at             UTC time the cycle was recorded (datetime, tz-aware)
request_at             UTC wall time of t_request (datetime)
first_sent_at          UTC wall time of t_first_sent (first content token to the client)
last_sent_at           UTC wall time of t_last_sent (last content token to the client)
t_request_wall_ns      the same as UTC epoch ns (Int64), for joins with events
t_last_sent_wall_ns    ditto for t_last_sent
target_ttft_s          targeted first-token floor (per arm or per-prompt draw)
target_tps             targeted tokens/s (real: raw ÷ time_scale)
experienced_ttft_s     t_first_sent − t_request as the participant saw it
total_wait_s           t_last_sent − t_request (the generation wait)
idle_wait_s            wait with nothing new to read: ``flowtrial.study.timeline.idle_wait_s`` of
                       (experienced TTFT, tokens_completion, achieved tokens/s) at the
                       study's reading speed, ``[analysis] reading_tps`` (default 5.3
                       tokens/s, Brysbaert 2019)
achieved_tps           content tokens after the first over t_last_sent − t_first_sent (real)
delivery               stream / all_at_once (the targeted delivery)
violation              the proxy's flag: the answer missed its schedule by > 5 ms raw
                       (upstream or proxy/machine: ``flowtrial.analysis.manipulation``
                       says which, and judges misses in real time)
violation_s            by how much the target was missed (real s)
tokens_completion      completion tokens (exact from upstream usage when given)
switched               context switch during the wait at the study's
                       ``capture.switch_min_away_s`` (see ``flowtrial.analysis.switches``)
switched_2s/10s/30s    the same at 2, 10 and 30 s (and any other sensitivity threshold)
switch_category        where focus went (payload category, else app); None if no switch
time_away_s            not-AFK time away of that switch (0 if none)
resumption_lag_s       t_last_sent → first focus back in a working app after a switch
                       (0 if no switch or back before the response was ready)
afk_overlap_s          AFK time inside the wait
switch_source          focus timeline used: client, activitywatch or none
decision               first accept / reject / partial (partial_accept) event, else none
review_time_s          decision time − t_last_sent (NaN without a decision)
persisted_<N>s         passive acceptance at each persistence interval (nullable boolean;
                       <NA> when not checked), from the ``persistence`` table when present
cycle_time_s           to the participant's next request; NaN beyond ``study.idle_limit_s``
                       (the cycle is open-ended) or for the last cycle
open_ended             True where cycle_time_s is NaN for that reason
=====================  ====================================================================

``task_table`` columns: task_id, participant_id, name, arm, period, forecast_fast_s,
forecast_slow_s, started_at, ended_at, task_time_s (ended − started, else the imported
``time_s``; both × time_scale), status, post_review_s (implementation time after review, as
entered: not scaled), outcome (done / abandoned / failed_review), link (pull request or
issue), n_cycles.

Both functions read with ``pandas.read_sql`` and are vectorized; the switch join uses
``merge_asof`` (100,000 cycles in a few seconds). The ``*_from_frames`` variants do the same
on in-memory tables (e.g. ``flowtrial.study.simulator.simulate_virtual_frames``) without a database.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.timeline import DEFAULT_READING_TPS, NS, idle_wait_s, wall_ns

from .switches import (
    AFK_KINDS,
    DEFAULT_SENSITIVITY_S,
    FOCUS_KINDS,
    classify_switches,
    switch_column,
)
from .turns import waiting_units

DECISION_KINDS = {"accept": "accept", "reject": "reject", "partial_accept": "partial"}
TASK_EVENT_KINDS = ("task_start", "task_end")

CYCLE_COLUMNS = [
    "id", "participant_id", "arm", "period", "task_id", "protocol", "status", "started_at",
    "mono_anchor_ns", "wall_anchor_ns", "t_request_ns", "t_first_sent_ns", "t_last_sent_ns",
    "target_ttft_ms", "target_tps", "target_delivery", "experienced_ttft_ms", "achieved_tps",
    "violation", "violation_ms", "tokens_completion", "tokens_sent", "request_kind", "turn_id",
    "tool_calls", "t_done_ns", "t_upstream_first_ns", "t_upstream_last_ns", "stream", "shaped",
    "t_upstream_first_output_ns", "upstream",
]
_NS_COLUMNS = ["mono_anchor_ns", "wall_anchor_ns", "t_request_ns", "t_first_sent_ns",
               "t_last_sent_ns", "t_done_ns", "t_upstream_first_ns", "t_upstream_last_ns",
               "t_upstream_first_output_ns"]


@dataclass
class StudyFrames:
    """The raw tables analysis needs, plus the study settings that interpret them."""

    cycles: pd.DataFrame
    events: pd.DataFrame
    tasks: pd.DataFrame
    participants: pd.DataFrame
    persistence: pd.DataFrame
    time_scale: float = 1.0
    idle_limit_s: float = 600.0
    switch_min_away_s: float = 10.0
    switch_sensitivity_s: list[float] = field(default_factory=lambda: list(DEFAULT_SENSITIVITY_S))
    working_apps: list[str] = field(default_factory=list)
    extra: dict[str, pd.DataFrame] = field(default_factory=dict)
    reading_tps: float = DEFAULT_READING_TPS  # the study's [analysis] reading_tps
    #: The built-in model's (TTFT ms, tokens/s) when it ran in the proxy's process
    #: (``[upstream] kind = "mock"``): the manipulation check's fault classes need it.
    model_speed: tuple[float, float] | None = None


def model_speed(config: Any) -> tuple[float, float] | None:
    """The in-process built-in model's own (TTFT ms, tokens/s), raw; None for another
    upstream."""
    up = config.upstream
    if up.kind != "mock":
        return None
    return float(up.mock.ttft_ms), float(up.mock.tokens_per_second)


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})


def _has_table(database: Any, name: str) -> bool:
    from sqlalchemy import inspect

    return inspect(database.engine).has_table(name)


def read_frames(database: Any) -> StudyFrames:
    """Read the tables analysis needs from an open ``flowtrial.study.storage.Database``."""
    config = database.config()
    scale = float(database.time_scale())
    with database.engine.connect() as conn:
        cycles = pd.read_sql(
            f"SELECT {', '.join(CYCLE_COLUMNS)} FROM cycles", conn,
            # nullable ints keep ns exact (float64 would round epoch ns to 256 ns)
            dtype_backend="numpy_nullable",
        )
        kinds = [*FOCUS_KINDS, *AFK_KINDS, *DECISION_KINDS, *TASK_EVENT_KINDS]
        placeholders = ", ".join(f"'{k}'" for k in kinds)
        events = pd.read_sql(
            # Only focus payloads (app, category) and agent telemetry's decision payloads
            # (who decided) are used: skip the rest's text.
            "SELECT participant_id, cycle_id, kind, ts_ns, source, CASE WHEN kind IN "
            "('focus_out', 'focus_in') OR (source = 'otel' AND kind IN ('accept', 'reject', "
            "'partial_accept')) THEN payload_json END AS payload_json FROM events "
            f"WHERE kind IN ({placeholders})", conn,
        )
        tasks = pd.read_sql("SELECT * FROM tasks", conn, dtype_backend="numpy_nullable")
        participants = pd.read_sql(
            "SELECT id, working_apps_json, simulated FROM participants", conn
        )
        persistence = (
            pd.read_sql("SELECT cycle_id, interval_s, persisted FROM persistence", conn)
            if _has_table(database, "persistence") else _empty(["cycle_id", "interval_s",
                                                                "persisted"])
        )
        assignments = pd.read_sql("SELECT participant_id, period, arm FROM assignments", conn)
    return StudyFrames(
        cycles=cycles, events=events, tasks=tasks, participants=participants,
        persistence=persistence, time_scale=scale,
        idle_limit_s=float(config.study.idle_limit_s),
        switch_min_away_s=float(config.capture.switch_min_away_s),
        switch_sensitivity_s=[float(x) for x in config.capture.switch_sensitivity_s],
        working_apps=list(config.capture.working_apps),
        extra={"assignments": assignments},
        reading_tps=float(config.analysis.reading_tps),
        model_speed=model_speed(config),
    )


def frames_from_tables(tables: Mapping[str, pd.DataFrame], config: Any,
                       time_scale: float | None = None) -> StudyFrames:
    """``StudyFrames`` from in-memory tables named like the database tables (``cycles``,
    ``events``, ``tasks``, ``participants``, ``persistence``, ``assignments``), e.g. the
    output of ``simulate_virtual_frames``; ``config`` is the ``StudyConfig``."""
    def get(name: str, cols: list[str]) -> pd.DataFrame:
        df = tables.get(name)
        return df.copy() if df is not None else _empty(cols)

    cycles = get("cycles", CYCLE_COLUMNS)
    if "id" not in cycles.columns and "cycle_id" in cycles.columns:
        cycles = cycles.rename(columns={"cycle_id": "id"})
    return StudyFrames(
        cycles=cycles,
        events=get("events", ["participant_id", "cycle_id", "kind", "ts_ns", "source",
                              "payload_json"]),
        tasks=get("tasks", ["id", "participant_id", "name", "period", "arm"]),
        participants=get("participants", ["id", "working_apps_json", "simulated"]),
        persistence=get("persistence", ["cycle_id", "interval_s", "persisted"]),
        time_scale=float(time_scale if time_scale is not None else config.study.time_scale),
        idle_limit_s=float(config.study.idle_limit_s),
        switch_min_away_s=float(config.capture.switch_min_away_s),
        switch_sensitivity_s=[float(x) for x in config.capture.switch_sensitivity_s],
        working_apps=list(config.capture.working_apps),
        extra={"assignments": get("assignments", ["participant_id", "period", "arm"])},
        reading_tps=float(config.analysis.reading_tps),
        model_speed=model_speed(config),
    )


def _float(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _int_ns(s: pd.Series) -> pd.array:
    return pd.array(pd.to_numeric(s, errors="coerce"), dtype="Int64")


def person_decisions(dec: pd.DataFrame) -> pd.DataFrame:
    """Decision events the person made: an agent's tool decision taken by its configuration
    (a rule, mode or "always allow"; agent telemetry's ``payload.decided_by = "config"``) is
    not the person's review of the answer, so it neither decides the cycle nor times a
    review."""
    if dec.empty or "source" not in dec.columns or "payload_json" not in dec.columns:
        return dec
    otel = (dec["source"].astype(object) == "otel").to_numpy(bool)
    if not otel.any():
        return dec
    (by,) = _payload_fields(dec["payload_json"], ("decided_by",))
    return dec[~(otel & (by == "config"))]


def _payload_fields(payload: pd.Series, keys: tuple[str, ...]) -> list[np.ndarray]:
    """Keys from JSON payloads (str or already-parsed dict), parsed once; None where absent."""
    out = [np.full(len(payload), None, dtype=object) for _ in keys]
    loads = json.loads
    for i, raw in enumerate(payload.to_numpy(object)):
        if isinstance(raw, str):
            if not raw:
                continue
            try:
                raw = loads(raw)
            except json.JSONDecodeError:
                continue
        if isinstance(raw, dict):
            for arr, k in zip(out, keys, strict=True):
                arr[i] = raw.get(k)
    return out


def _wall(cyc: pd.DataFrame, col: str) -> pd.api.extensions.ExtensionArray:
    """UTC epoch ns of a monotonic column (Int64; <NA> where the time is missing)."""
    t = _int_ns(cyc[col])
    vals = wall_ns(
        t.fillna(0).to_numpy(np.int64),
        _int_ns(cyc["mono_anchor_ns"]).fillna(0).to_numpy(np.int64),
        _int_ns(cyc["wall_anchor_ns"]).fillna(0).to_numpy(np.int64),
    )
    arr = pd.array(vals, dtype="Int64")
    arr[np.asarray(pd.isna(t), dtype=bool)] = pd.NA
    return arr


def working_overrides(participants: pd.DataFrame) -> dict[str, list[str]]:
    """Each participant's own working-app list, where the study gave one (id → apps)."""
    out: dict[str, list[str]] = {}
    if "working_apps_json" not in participants.columns:
        return out
    for pid, raw in zip(participants["id"], participants["working_apps_json"], strict=True):
        if isinstance(raw, str) and raw:
            try:
                apps = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(apps, list) and apps:
                out[str(pid)] = [str(a) for a in apps]
    return out


def cycle_table_from_frames(
    frames: StudyFrames, reading_tps: float | None = None
) -> pd.DataFrame:
    """The per-cycle table (see the module docstring) from in-memory tables. ``reading_tps``
    overrides the study's reading speed (``frames.reading_tps``) in the idle wait.

    Where agents made multi-call turns or side calls exist, a row is an agent turn, not a
    cycle (:func:`flowtrial.analysis.turns.waiting_units`); ``attrs["wait_unit"]`` says
    which."""
    scale = frames.time_scale
    reading_tps = frames.reading_tps if reading_tps is None else float(reading_tps)
    c, unit = waiting_units(frames.cycles)
    if "id" in c.columns:
        c = c.rename(columns={"id": "cycle_id"})
    n = len(c)
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["cycle_id"] = c["cycle_id"].astype(str).to_numpy(object)
    out["participant_id"] = c["participant_id"].astype(str).to_numpy(object)
    out["arm"] = c["arm"].astype(str).to_numpy(object)
    for col in ("period", "task_id"):
        out[col] = pd.array(pd.to_numeric(c[col], errors="coerce"), dtype="Int64") \
            if col in c.columns else pd.array([pd.NA] * n, dtype="Int64")
    for col in ("protocol", "status"):
        out[col] = c[col].astype(object).to_numpy() if col in c.columns else None
    if "started_at" in c.columns and n:
        out["started_at"] = pd.to_datetime(c["started_at"], utc=True, format="mixed") \
            .reset_index(drop=True)
    else:
        out["started_at"] = pd.Series(pd.NaT, index=out.index, dtype="datetime64[ns, UTC]")

    req = _wall(c, "t_request_ns")
    first = _wall(c, "t_first_sent_ns")
    last = _wall(c, "t_last_sent_ns")
    out["request_at"] = pd.to_datetime(pd.Series(req, dtype="Int64"), unit="ns", utc=True)
    out["first_sent_at"] = pd.to_datetime(pd.Series(first, dtype="Int64"), unit="ns", utc=True)
    out["last_sent_at"] = pd.to_datetime(pd.Series(last, dtype="Int64"), unit="ns", utc=True)
    out["t_request_wall_ns"] = req
    out["t_last_sent_wall_ns"] = last

    t_req = _int_ns(c["t_request_ns"])
    d_first = (_int_ns(c["t_first_sent_ns"]) - t_req).to_numpy(dtype=float, na_value=np.nan)
    d_last = (_int_ns(c["t_last_sent_ns"]) - t_req).to_numpy(dtype=float, na_value=np.nan)

    out["target_ttft_s"] = _float(c["target_ttft_ms"]) / 1000 * scale
    out["target_tps"] = _float(c["target_tps"]) / scale
    exp_ttft = _float(c["experienced_ttft_ms"]) / 1000
    exp_ttft = np.where(np.isfinite(exp_ttft), exp_ttft, d_first / NS)
    out["experienced_ttft_s"] = exp_ttft * scale
    out["total_wait_s"] = d_last / NS * scale
    out["achieved_tps"] = _float(c["achieved_tps"]) / scale
    out["violation"] = pd.to_numeric(c["violation"], errors="coerce").fillna(0) \
        .to_numpy(dtype=float).astype(bool)
    out["violation_s"] = (_float(c["violation_ms"]) / 1000 * scale
                          if "violation_ms" in c.columns else np.nan)
    tok = _float(c["tokens_completion"])
    if "tokens_sent" in c.columns:
        tok = np.where(np.isfinite(tok), tok, _float(c["tokens_sent"]))
    out["tokens_completion"] = pd.array(np.round(tok), dtype="Float64").astype("Int64")
    idle = idle_wait_s(out["experienced_ttft_s"].to_numpy(float), np.nan_to_num(tok),
                       out["achieved_tps"].to_numpy(float), reading_tps)
    out["idle_wait_s"] = np.where(np.isfinite(d_last), idle, np.nan)
    out["delivery"] = c["target_delivery"].astype(object).to_numpy() \
        if "target_delivery" in c.columns else None

    # ---- context switches (analysis.switches) on the focus/AFK timeline
    ev = frames.events
    fev = ev[ev["kind"].isin([*FOCUS_KINDS, *AFK_KINDS])]
    app, category = (_payload_fields(fev["payload_json"], ("app", "category"))
                     if "payload_json" in fev.columns else (None, None))
    fev = pd.DataFrame({
        "participant_id": fev["participant_id"].astype(str).to_numpy(object),
        "kind": fev["kind"].astype(str).to_numpy(object),
        "ts_ns": pd.to_numeric(fev["ts_ns"]).to_numpy(np.int64),
        "source": (fev["source"].astype(object).to_numpy() if "source" in fev.columns
                   else "client"),
        "app": app,
        "category": category,
    })
    sens = sorted({*DEFAULT_SENSITIVITY_S, *frames.switch_sensitivity_s})
    sw = classify_switches(
        out[["cycle_id", "participant_id", "t_request_wall_ns", "t_last_sent_wall_ns"]],
        fev,
        frames.switch_min_away_s,
        frames.working_apps,
        sensitivity_s=sens,
        time_scale=scale,
        participant_working_apps=working_overrides(frames.participants),
    )
    for col in ["switched", *[switch_column(m) for m in sorted({*sens,
                                                               frames.switch_min_away_s})],
                "switch_category", "time_away_s", "resumption_lag_s", "afk_overlap_s",
                "switch_source"]:
        out[col] = sw[col].to_numpy()

    # ---- decisions: the first accept / reject / partial_accept naming the cycle
    dec = person_decisions(ev[ev["kind"].isin(list(DECISION_KINDS)) & ev["cycle_id"].notna()])
    dec = dec.assign(ts_ns=pd.to_numeric(dec["ts_ns"]).astype(np.int64))
    dec = dec.sort_values("ts_ns", kind="stable").drop_duplicates("cycle_id")
    dmap = pd.Series(dec["kind"].map(DECISION_KINDS).to_numpy(object),
                     index=dec["cycle_id"].astype(str).to_numpy(object))
    tmap = pd.Series(dec["ts_ns"].to_numpy(np.int64),
                     index=dec["cycle_id"].astype(str).to_numpy(object))
    out["decision"] = out["cycle_id"].map(dmap).astype(object).fillna("none")
    dts = out["cycle_id"].map(tmap)
    last_f = pd.Series(last, dtype="Int64").to_numpy(dtype=float, na_value=np.nan)
    # Subtract in int64 where both exist (epoch ns exceed float precision).
    both = dts.notna().to_numpy() & np.isfinite(last_f)
    review = np.full(n, np.nan)
    if both.any():
        d_ns = dts[both].to_numpy(np.int64) - last.fillna(0).to_numpy(np.int64)[both]
        review[both] = d_ns / NS * scale
    out["review_time_s"] = review

    # ---- persistence (passive acceptance) per interval
    per = frames.persistence
    if per is not None and len(per):
        per = per.assign(cycle_id=per["cycle_id"].astype(str),
                         interval_s=pd.to_numeric(per["interval_s"]))
        for iv in sorted(per["interval_s"].dropna().unique()):
            sub = per[per["interval_s"] == iv].drop_duplicates("cycle_id", keep="last")
            m = pd.Series(sub["persisted"].astype(bool).to_numpy(),
                          index=sub["cycle_id"].to_numpy(object))
            out[f"persisted_{iv:g}s"] = pd.array(out["cycle_id"].map(m), dtype="boolean")

    # ---- cycle time: to the next request of the same participant
    order = np.lexsort((req.fillna(0).to_numpy(np.int64), out["participant_id"].to_numpy()))
    out = out.iloc[order].reset_index(drop=True)
    req_sorted = out["t_request_wall_ns"].to_numpy(np.int64) if n else np.array([], np.int64)
    same = np.r_[out["participant_id"].to_numpy()[1:] == out["participant_id"].to_numpy()[:-1],
                 False] if n else np.array([], bool)
    nxt = np.r_[req_sorted[1:], 0] if n else req_sorted
    gap = np.where(same, (nxt - req_sorted) / NS * scale, np.nan)
    open_ended = same & (gap > frames.idle_limit_s)
    out["cycle_time_s"] = np.where(open_ended, np.nan, gap)
    out["open_ended"] = open_ended
    out.attrs["wait_unit"] = unit.as_dict()
    return out


def cycle_table(database: Any, reading_tps: float | None = None) -> pd.DataFrame:
    """One row per cycle with real-second timings, switches, decisions and persistence
    (columns in the module docstring). ``database`` is a ``flowtrial.study.storage.Database``."""
    return cycle_table_from_frames(read_frames(database), reading_tps)


def task_table_from_frames(frames: StudyFrames) -> pd.DataFrame:
    """The per-task table (see the module docstring) from in-memory tables."""
    t = frames.tasks
    scale = frames.time_scale
    n = len(t)
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["task_id"] = pd.array(pd.to_numeric(t["id"], errors="coerce"), dtype="Int64") \
        if "id" in t.columns else pd.array(range(n), dtype="Int64")
    out["participant_id"] = t["participant_id"].astype(str).to_numpy(object)
    out["name"] = t["name"].astype(object).to_numpy() if "name" in t.columns else None
    out["period"] = pd.array(pd.to_numeric(t["period"], errors="coerce"), dtype="Int64") \
        if "period" in t.columns else pd.array([pd.NA] * n, dtype="Int64")
    arm = t["arm"].astype(object).to_numpy() if "arm" in t.columns else np.full(n, None)
    arm = np.array([a if isinstance(a, str) and a else None for a in arm], dtype=object)
    # A task without its own arm gets the participant's assignment for its period.
    assign = frames.extra.get("assignments")
    if assign is not None and len(assign) and (pd.isna(arm).any() if n else False):
        key = assign.assign(period=pd.to_numeric(assign["period"]).fillna(0).astype(int))
        amap = {(str(p), int(q)): a for p, q, a in
                zip(key["participant_id"], key["period"], key["arm"], strict=True)}
        per = out["period"].fillna(0).to_numpy(dtype=int)
        for i in np.flatnonzero(pd.isna(arm)):
            arm[i] = amap.get((out["participant_id"].iat[i], int(per[i])))
    out["arm"] = arm
    for col in ("forecast_fast_s", "forecast_slow_s"):
        out[col] = _float(t[col]) if col in t.columns else np.nan
    start = _int_ns(t["started_at_ns"]) if "started_at_ns" in t.columns else \
        pd.array([pd.NA] * n, dtype="Int64")
    end = _int_ns(t["ended_at_ns"]) if "ended_at_ns" in t.columns else \
        pd.array([pd.NA] * n, dtype="Int64")
    out["started_at"] = pd.to_datetime(pd.Series(start, dtype="Int64"), unit="ns", utc=True)
    out["ended_at"] = pd.to_datetime(pd.Series(end, dtype="Int64"), unit="ns", utc=True)
    observed = (end - start).to_numpy(dtype=float, na_value=np.nan) / NS
    imported = _float(t["time_s"]) if "time_s" in t.columns else np.full(n, np.nan)
    out["task_time_s"] = np.where(np.isfinite(observed), observed, imported) * scale
    out["status"] = t["status"].astype(object).to_numpy() if "status" in t.columns else None
    # After review (schema 8): entered by the participant in real minutes, so not scaled.
    out["post_review_s"] = _float(t["post_review_s"]) if "post_review_s" in t.columns \
        else np.nan
    out["outcome"] = t["outcome"].astype(object).to_numpy() if "outcome" in t.columns \
        else None
    out["link"] = t["link"].astype(object).to_numpy() if "link" in t.columns else None
    tid = pd.to_numeric(frames.cycles.get("task_id", pd.Series([], dtype=float)),
                        errors="coerce").dropna()
    counts = tid.astype(np.int64).value_counts()
    out["n_cycles"] = out["task_id"].map(counts).fillna(0).astype(int).to_numpy() if n else 0
    return out


def task_table(database: Any) -> pd.DataFrame:
    """One row per task: arm, forecasts and task time in real seconds (module docstring)."""
    return task_table_from_frames(read_frames(database))
