"""Agent telemetry in the analysis: tool decisions, who made them, how long the person took,
and how long the agent waited for the person — per arm and by band of the cycle's wait.

Events come from the agents' own OpenTelemetry (``events.source = "otel"``; see
``flowtrial.instrumentation.telemetry``), each linked to the cycle whose answer proposed the
tool. Per arm / wait band:

- ``tool_decisions``, ``by_person``, ``by_config``: decisions counted, and who made them;
- ``person_acceptance_rate``: accepts (any kind) ÷ the person's decisions; ``partial_rate``;
- ``time_to_decide_s_median``: the person's decision − the proposing answer's last token;
- ``cycles_agent_waited``: cycles during which the agent waited for the person, and
  ``agent_wait_s_median`` / ``agent_wait_s_total`` of those waits;
- ``tool_time_s_total``, ``turns`` (prompts) and ``agent_requests`` (the agent's own timed
  requests) for context.

Durations in real seconds (× ``time_scale``). ``None`` when there is no agent telemetry.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["AGENT_KINDS", "agent_section", "read_agent_events"]

AGENT_KINDS = ("turn_start", "accept", "reject", "partial_accept", "api_request",
               "tool_result", "agent_wait", "turn_end")
_DECISIONS = ("accept", "reject", "partial_accept")
_ACCEPTS = ("accept", "partial_accept")
NS = 1_000_000_000


def read_agent_events(database: Any) -> pd.DataFrame:
    """The study's agent-telemetry events linked to cycles, with who decided."""
    from sqlalchemy import bindparam, text

    sql = text("SELECT participant_id, cycle_id, kind, ts_ns, duration_s, payload_json "
               "FROM events WHERE source = 'otel' AND cycle_id IS NOT NULL AND kind IN :k"
               ).bindparams(bindparam("k", expanding=True))
    with database.engine.connect() as conn:
        rows = conn.execute(sql, {"k": list(AGENT_KINDS)}).all()
    df = pd.DataFrame(rows, columns=["participant_id", "cycle_id", "kind", "ts_ns",
                                     "duration_s", "payload_json"])
    by = []
    for raw in df["payload_json"]:
        try:
            p = json.loads(raw) if raw else {}
        except ValueError:
            p = {}
        by.append(p.get("decided_by") if isinstance(p, dict) else None)
    df["decided_by"] = pd.Series(by, dtype=object)
    return df.drop(columns=["payload_json"])


def _num(x: Any) -> float | None:
    return float(x) if x is not None and not (isinstance(x, float) and math.isnan(x)) else None


def _rates(ev: pd.DataFrame, cyc: pd.DataFrame, scale: float) -> dict[str, Any]:
    dec = ev[ev["kind"].isin(_DECISIONS)]
    person = dec[dec["decided_by"] == "person"]
    n_person = len(person)
    last = cyc.set_index("cycle_id")["t_last_sent_wall_ns"]
    decide_s = []
    if n_person:
        t_last = person["cycle_id"].map(last)
        ok = t_last.notna().to_numpy()
        d = (pd.to_numeric(person["ts_ns"]).to_numpy(np.int64)[ok]
             - t_last[ok].to_numpy(np.int64)) / NS * scale
        decide_s = [x for x in d if x >= 0]
    waits = ev[ev["kind"] == "agent_wait"]
    per_cycle = waits.groupby("cycle_id")["duration_s"].sum() * scale
    tools = ev.loc[ev["kind"] == "tool_result", "duration_s"].dropna() * scale
    return {
        "cycles": int(len(cyc)),
        "turns": int((ev["kind"] == "turn_start").sum()),
        "agent_requests": int((ev["kind"] == "api_request").sum()),
        "tool_decisions": int(len(dec)),
        "by_person": n_person,
        "by_config": int((dec["decided_by"] == "config").sum()),
        "person_acceptance_rate": (float(person["kind"].isin(_ACCEPTS).mean())
                                   if n_person else None),
        "partial_rate": (float((person["kind"] == "partial_accept").mean())
                         if n_person else None),
        "time_to_decide_s_median": float(np.median(decide_s)) if decide_s else None,
        "cycles_agent_waited": int((per_cycle > 0).sum()),
        "agent_wait_s_median": _num(per_cycle.median()) if len(per_cycle) else None,
        "agent_wait_s_total": float(per_cycle.sum()) if len(per_cycle) else 0.0,
        "tool_time_s_total": float(tools.sum()) if len(tools) else 0.0,
    }


def agent_section(cycles: pd.DataFrame, events: pd.DataFrame, wait_col: str,
                  bands: list[float], scale: float = 1.0) -> dict[str, Any] | None:
    """Decision rates and agent waits per arm and by band of ``wait_col``; None without
    agent telemetry on any cycle."""
    if events.empty or cycles.empty:
        return None
    cyc = cycles[["cycle_id", "arm", wait_col, "t_last_sent_wall_ns"]].copy()
    cyc["cycle_id"] = cyc["cycle_id"].astype(str)
    ev = events[events["cycle_id"].astype(str).isin(set(cyc["cycle_id"]))].copy()
    if ev.empty:
        return None
    ev["cycle_id"] = ev["cycle_id"].astype(str)
    ev = ev.merge(cyc[["cycle_id", "arm", wait_col]], on="cycle_id", how="left")
    by_arm = [{"arm": arm, **_rates(g, cyc[cyc["arm"] == arm], scale)}
              for arm, g in ev.groupby("arm", sort=True)]
    w = cyc[wait_col].to_numpy(float)
    band = np.searchsorted(bands, np.nan_to_num(w, nan=-1), side="right") - 1
    by_band = []
    for b in range(len(bands) - 1):
        ids = set(cyc["cycle_id"].to_numpy(object)[(band == b) & np.isfinite(w)])
        g = ev[ev["cycle_id"].isin(ids)]
        if g.empty:
            continue
        lo, hi = bands[b], bands[b + 1]
        label = f"{lo:g}–{hi:g} s" if math.isfinite(hi) else f"≥ {lo:g} s"
        by_band.append({"band": label, **_rates(g, cyc[cyc["cycle_id"].isin(ids)], scale)})
    return {"wait_measure": wait_col, "by_arm": by_arm, "by_wait_band": by_band,
            "overall": _rates(ev, cyc, scale)}
