"""Agent telemetry per agent turn: the agent's own account of each turn (prompt, tool
decisions, tool run time, time it waited for the person) beside the proxy's record of it.

:func:`events_by_turn` ties every agent-telemetry event (``events.source = "otel"``) to the
``turns`` row it belongs to, and says how (``turn_link``):

- ``cycle``: the event's cycle (``events.cycle_id``, set when it arrived) belongs to a turn
  (``cycles.turn_id``) as a ``human``, ``continuation`` or ``retry`` call. A prompt
  (``turn_start``) only counts when that cycle is the turn's first call: the prompt *starts*
  the turn;
- ``time``: otherwise by participant and time. A prompt belongs to the participant's first
  turn starting at or after it (within :data:`PROMPT_TOLERANCE_S`); any other event to the
  latest turn that started at or before it, until the next turn starts (decisions and tool
  runs come after the answer that proposed them, possibly after its last token), at most
  :data:`HORIZON_S` after that turn's end. Side calls (titles, summaries) join the turn
  open when they were sent — often the previous one — so an event linked to a side call is
  placed by time too.

:func:`turn_table` then gives one row per turn with telemetry (durations in real seconds,
× ``time_scale``):

==========================  =================================================================
``prompts``                 the person's prompts that started the turn (turn-start evidence)
``prompt_to_request_s``     the prompt → the turn's first request (the agent's preparation)
``agent_requests``          model requests the agent timed (logs; spans of the same calls
                            not counted again)
``agent_tool_s``            the agent's own tool run time (``tool_result`` durations)
``proxy_tool_s``            the proxy's tool time: a call's end → the next continuation
                            (includes the time the agent waited for the person)
``agent_waited_s``          the agent waited for the person (permission prompts)
``decisions``, ``by_person``, ``by_config``, ``person_accepts``, ``person_rejects``,
``person_partial``          tool decisions and who took them
``time_to_decide_s``        median over the person's decisions: decision − the proposing
                            answer's end (its last token, else the call's end)
``turn_ends``               the agent reported the turn's end (Claude Code's ``interaction``
                            span, Codex's ``notify`` through ``flowtrial codex-notify``)
``agent_turn_s``            the agent's own turn duration (Claude Code ``interaction`` span)
``wait_s``, ``model_s``     the proxy's wait of the turn and its model time
==========================  =================================================================
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "HORIZON_S",
    "PROMPT_TOLERANCE_S",
    "events_by_turn",
    "read_turn_inputs",
    "turn_section",
    "turn_table",
    "turn_telemetry",
]

#: The receiver's own windows (``flowtrial.instrumentation.telemetry.ingest``): a prompt
#: leads the request it causes by at most this; a decision may follow its answer by this.
PROMPT_TOLERANCE_S = 120.0
HORIZON_S = 3600.0
_KINDS = ("turn_start", "accept", "reject", "partial_accept", "api_request", "tool_result",
          "agent_wait", "turn_end")
_DECISIONS = ("accept", "reject", "partial_accept")
NS = 1_000_000_000

_EVENT_COLS = ["event_id", "participant_id", "cycle_id", "kind", "ts_ns", "duration_s",
               "decided_by", "agent", "span"]
_TURN_COLS = ["turn_id", "participant_id", "arm", "client", "start_ns", "end_ns",
              "model_calls", "wait_ms", "model_ms", "tool_ms", "status", "first_cycle_id"]
_CYCLE_COLS = ["cycle_id", "participant_id", "turn_id", "request_kind", "request_ns",
               "end_ns"]


def read_turn_inputs(database: Any, participants: list[str] | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(agent events, turns, cycles) of the study (or of ``participants``), wall clock ns."""
    from sqlalchemy import bindparam, text

    where = " AND participant_id IN :p" if participants else ""
    params: dict[str, Any] = {"k": list(_KINDS)}
    if participants:
        params["p"] = list(participants)
    ev_sql = text("SELECT id, participant_id, cycle_id, kind, ts_ns, duration_s, payload_json "
                  "FROM events WHERE source = 'otel' AND kind IN :k" + where)
    turn_sql = text(
        "SELECT id, participant_id, arm, client, wall_anchor_ns + t_start_ns - mono_anchor_ns,"
        " wall_anchor_ns + t_end_ns - mono_anchor_ns, model_calls, wait_ms, model_ms, "
        "tool_ms, status, first_cycle_id FROM turns WHERE 1 = 1" + where)
    cyc_sql = text(
        "SELECT id, participant_id, turn_id, request_kind, "
        "wall_anchor_ns + t_request_ns - mono_anchor_ns, "
        "wall_anchor_ns + COALESCE(t_last_sent_ns, t_done_ns, t_request_ns) - mono_anchor_ns "
        "FROM cycles WHERE 1 = 1" + where)
    binds: list[Any] = [bindparam("p", expanding=True)] if participants else []
    with database.engine.connect() as conn:
        ev = conn.execute(ev_sql.bindparams(bindparam("k", expanding=True), *binds),
                          params).all()
        turns = conn.execute(turn_sql.bindparams(*binds), params).all()
        cycles = conn.execute(cyc_sql.bindparams(*binds), params).all()
    rows = []
    for i, pid, cid, kind, ts, dur, raw in ev:
        try:
            p = json.loads(raw) if raw else {}
        except ValueError:
            p = {}
        p = p if isinstance(p, dict) else {}
        rows.append((i, pid, cid, kind, ts, dur, p.get("decided_by"), p.get("agent"),
                     bool(p.get("span"))))
    return (pd.DataFrame(rows, columns=_EVENT_COLS),
            pd.DataFrame(turns, columns=_TURN_COLS),
            pd.DataFrame(cycles, columns=_CYCLE_COLS))


def _by_time(ev: pd.DataFrame, turns: pd.DataFrame, forward: bool) -> pd.Series:
    """The turn each event falls in by participant and time (see the module docstring)."""
    if ev.empty or turns.empty:
        return pd.Series(None, index=ev.index, dtype=object)
    t = turns[["turn_id", "participant_id", "start_ns", "end_ns"]].copy()
    t["start_ns"] = t["start_ns"].astype(np.int64)
    t = t.sort_values("start_ns", kind="stable")
    e = ev[["participant_id", "ts_ns"]].assign(_row=ev.index, ts_ns=ev["ts_ns"].astype(
        np.int64)).sort_values("ts_ns", kind="stable")
    m = pd.merge_asof(e, t, left_on="ts_ns", right_on="start_ns", by="participant_id",
                      direction="forward" if forward else "backward",
                      tolerance=round(PROMPT_TOLERANCE_S * NS) if forward else None)
    if not forward:  # not past the turn's end + the horizon
        end = pd.to_numeric(m["end_ns"]).fillna(pd.to_numeric(m["start_ns"]))
        m.loc[(m["ts_ns"] - end) > HORIZON_S * NS, "turn_id"] = None
    return pd.Series(m["turn_id"].to_numpy(object), index=m["_row"].to_numpy()).reindex(
        ev.index)


def events_by_turn(events: pd.DataFrame, turns: pd.DataFrame, cycles: pd.DataFrame
                   ) -> pd.DataFrame:
    """``events`` with ``turn_id`` (None where no turn holds it) and ``turn_link``
    (``cycle`` | ``time`` | None)."""
    ev = events.copy()
    if ev.empty:
        return ev.assign(turn_id=pd.Series(dtype=object), turn_link=pd.Series(dtype=object))
    main = cycles[cycles["turn_id"].notna()
                  & (cycles["request_kind"].astype(object).fillna("human") != "side")]
    via = ev["cycle_id"].map(main.set_index("cycle_id")["turn_id"])
    prompt = ev["kind"] == "turn_start"
    # A prompt starts its turn: only a prompt on the turn's first call is linked by cycle.
    first_of = turns.set_index("turn_id")["first_cycle_id"]
    via = via.where(~prompt | (via.map(first_of) == ev["cycle_id"]))
    ev["turn_id"] = via.astype(object)
    link = np.full(len(ev), None, dtype=object)
    link[via.notna().to_numpy()] = "cycle"
    ev["turn_link"] = link
    todo = ev["turn_id"].isna()
    for fwd in (True, False):
        sel = todo & (prompt if fwd else ~prompt)
        if sel.any():
            found = _by_time(ev[sel], turns, forward=fwd)
            ev.loc[sel, "turn_id"] = found.to_numpy(object)
            ev.loc[sel & ev["turn_id"].notna(), "turn_link"] = "time"
    return ev


def _median(x: pd.Series) -> float | None:
    x = pd.to_numeric(x, errors="coerce").dropna()
    return float(x.median()) if len(x) else None


def turn_table(events: pd.DataFrame, turns: pd.DataFrame, cycles: pd.DataFrame,
               scale: float = 1.0) -> pd.DataFrame:
    """One row per turn that has agent telemetry (see the module docstring); ``events`` as
    :func:`events_by_turn` returns them."""
    ev = events[events["turn_id"].notna()] if len(events) else events
    cols = ["turn_id", "participant_id", "arm", "client", "start_ns", "model_calls",
            "wait_s", "model_s", "proxy_tool_s", "prompts", "prompt_to_request_s",
            "agent_requests", "agent_tool_s", "agent_waited_s", "decisions", "by_person",
            "by_config", "person_accepts", "person_rejects", "person_partial",
            "time_to_decide_s", "turn_ends", "agent_turn_s", "linked_by_cycle",
            "linked_by_time"]
    if ev is None or len(ev) == 0:
        return pd.DataFrame(columns=cols)
    # The proposing answer of each decision: its cycle's end, else the turn's latest call
    # that ended before it.
    ends = cycles[cycles["request_kind"].astype(object).fillna("human") != "side"]
    end_of = ends.set_index("cycle_id")["end_ns"]
    dec = ev[ev["kind"].isin(_DECISIONS)].copy()
    dec["answer_ns"] = dec["cycle_id"].map(end_of)
    lost = dec["answer_ns"].isna()
    if lost.any() and len(ends):
        e = ends[["participant_id", "end_ns"]].dropna().astype({"end_ns": np.int64})
        m = pd.merge_asof(dec.loc[lost, ["participant_id", "ts_ns"]].assign(
            _row=dec.index[lost], ts_ns=dec.loc[lost, "ts_ns"].astype(np.int64)).sort_values(
            "ts_ns"), e.sort_values("end_ns"), left_on="ts_ns", right_on="end_ns",
            by="participant_id", direction="backward")
        dec.loc[m["_row"].to_numpy(), "answer_ns"] = m["end_ns"].to_numpy(float)
    dec["decide_s"] = (dec["ts_ns"].astype(float) - dec["answer_ns"].astype(float)) / NS * scale
    t = turns.set_index("turn_id")
    out = []
    for tid, g in ev.groupby("turn_id", sort=False):
        if tid not in t.index:
            continue
        row = t.loc[tid]
        d = dec[dec["turn_id"] == tid]
        person = d[d["decided_by"] == "person"]
        prompts = g[g["kind"] == "turn_start"]
        dur = pd.to_numeric(g["duration_s"], errors="coerce") * scale

        def total(kind: str, dur: pd.Series = dur, g: pd.DataFrame = g) -> float | None:
            x = dur[g["kind"] == kind].dropna()
            return float(x.sum()) if len(x) else None

        lead = ((float(row["start_ns"]) - prompts["ts_ns"].astype(float).min()) / NS * scale
                if len(prompts) else None)
        ms = scale / 1000.0
        out.append({
            "turn_id": tid, "participant_id": row["participant_id"], "arm": row["arm"],
            "client": row["client"], "start_ns": int(row["start_ns"]),
            "model_calls": int(row["model_calls"]),
            "wait_s": None if pd.isna(row["wait_ms"]) else float(row["wait_ms"]) * ms,
            "model_s": None if pd.isna(row["model_ms"]) else float(row["model_ms"]) * ms,
            "proxy_tool_s": None if pd.isna(row["tool_ms"]) else float(row["tool_ms"]) * ms,
            "prompts": len(prompts), "prompt_to_request_s": lead,
            # the request logs (Claude Code's beta llm_request spans time the same calls)
            "agent_requests": int(((g["kind"] == "api_request") & ~g["span"].astype(bool)
                                   ).sum()),
            "agent_tool_s": total("tool_result"), "agent_waited_s": total("agent_wait"),
            "decisions": len(d), "by_person": len(person),
            "by_config": int((d["decided_by"] == "config").sum()),
            "person_accepts": int((person["kind"] == "accept").sum()),
            "person_rejects": int((person["kind"] == "reject").sum()),
            "person_partial": int((person["kind"] == "partial_accept").sum()),
            "time_to_decide_s": _median(person["decide_s"][person["decide_s"] >= 0]),
            "turn_ends": int((g["kind"] == "turn_end").sum()),
            "agent_turn_s": total("turn_end"),
            "linked_by_cycle": int((g["turn_link"] == "cycle").sum()),
            "linked_by_time": int((g["turn_link"] == "time").sum()),
        })
    return pd.DataFrame(out, columns=cols).sort_values(
        ["participant_id", "start_ns"], kind="stable").reset_index(drop=True)


def turn_telemetry(database: Any, participants: list[str] | None = None,
                   scale: float | None = None) -> pd.DataFrame:
    """:func:`turn_table` of the study's database (``scale`` default: the study's)."""
    events, turns, cycles = read_turn_inputs(database, participants)
    if scale is None:
        scale = float(database.time_scale())
    return turn_table(events_by_turn(events, turns, cycles), turns, cycles, scale)


def _summary(g: pd.DataFrame) -> dict[str, Any]:
    person = int(g["by_person"].sum())
    accepts = int(g["person_accepts"].sum() + g["person_partial"].sum())
    both = g.dropna(subset=["agent_tool_s", "proxy_tool_s"])
    waited = g[pd.to_numeric(g["agent_waited_s"]).fillna(0) > 0]
    return {
        "turns": len(g),
        "turns_with_prompt": int((g["prompts"] > 0).sum()),
        "turns_with_decisions": int((g["decisions"] > 0).sum()),
        "decisions": int(g["decisions"].sum()), "by_person": person,
        "by_config": int(g["by_config"].sum()),
        "person_acceptance_rate": accepts / person if person else None,
        "person_rejects": int(g["person_rejects"].sum()),
        "time_to_decide_s_median": _median(g["time_to_decide_s"]),
        "agent_tool_s_total": float(both["agent_tool_s"].sum()) if len(both) else None,
        "proxy_tool_s_total": float(both["proxy_tool_s"].sum()) if len(both) else None,
        "turns_agent_waited": len(waited),
        "agent_waited_s_median": _median(waited["agent_waited_s"]),
        "agent_waited_s_total": float(pd.to_numeric(g["agent_waited_s"]).fillna(0).sum()),
    }


def turn_section(table: pd.DataFrame, bands: list[float], total_turns: int,
                 max_rows: int = 40) -> dict[str, Any] | None:
    """The report's section: per arm, by band of the turn's model time (the part of the wait
    the arm sets: the turn's whole wait also holds the person's own approval time), and the
    first ``max_rows`` turns; None when no turn has agent telemetry."""
    if table.empty:
        return None
    by_arm = [{"arm": arm, **_summary(g)} for arm, g in table.groupby("arm", sort=True)]
    w = pd.to_numeric(table["model_s"]).to_numpy(float)
    band = np.searchsorted(bands, np.nan_to_num(w, nan=-1), side="right") - 1
    by_band = []
    for b in range(len(bands) - 1):
        g = table[(band == b) & np.isfinite(w)]
        if g.empty:
            continue
        lo, hi = bands[b], bands[b + 1]
        label = f"{lo:g}–{hi:g} s" if math.isfinite(hi) else f"≥ {lo:g} s"
        by_band.append({"band": label, **_summary(g)})
    keep = ["turn_id", "participant_id", "arm", "client", "model_calls", "wait_s", "model_s",
            "proxy_tool_s", "agent_tool_s", "agent_waited_s", "prompts", "decisions",
            "by_person", "by_config", "person_accepts", "person_rejects", "time_to_decide_s"]
    rows = table[keep].head(max_rows).astype(object).where(table[keep].head(max_rows).notna(),
                                                           None)
    return {"turns_total": int(total_turns), "band_measure": "model_s",
            "overall": _summary(table), "by_arm": by_arm, "by_model_time_band": by_band,
            "turns": rows.to_dict("records"), "turns_shown": len(rows)}
