"""A quick look at a (simulated) study: switch rate by wait band, violations.

This is the glance ``flowtrial demo`` and ``flowtrial simulate`` print, not the
preregistered analysis (``analysis``): a cycle counts as a switch when focus left the
working apps (a ``focus_out`` to a non-working app) between ``t_request`` and
``t_last_sent`` for at least the study's ``capture.switch_min_away_s`` real seconds.
Waits are the experienced TTFT in real seconds (raw × ``time_scale``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..storage import Database

DEFAULT_BANDS_S: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 20.0, float("inf"))


def _band_label(lo: float, hi: float) -> str:
    return f"≥ {lo:g} s" if np.isinf(hi) else f"{lo:g}–{hi:g} s"


def cycle_switches(database: Database) -> pd.DataFrame:
    """Per cycle: participant, wait (real s), violation and whether the participant switched."""
    config = database.config()
    scale = config.study.time_scale
    working = {a.lower() for a in config.capture.working_apps}
    with database.engine.connect() as conn:
        cyc = pd.read_sql(
            "SELECT id, participant_id, mono_anchor_ns, wall_anchor_ns, t_request_ns, "
            "t_last_sent_ns, experienced_ttft_ms, violation, status FROM cycles", conn)
        ev = pd.read_sql(
            "SELECT participant_id, cycle_id, kind, ts_ns, duration_s, payload_json FROM events "
            "WHERE kind IN ('focus_out', 'focus_in')", conn)
    cyc["req"] = (cyc["wall_anchor_ns"] + cyc["t_request_ns"] - cyc["mono_anchor_ns"]).astype(
        "int64")
    last = cyc["wall_anchor_ns"] + cyc["t_last_sent_ns"] - cyc["mono_anchor_ns"]
    cyc["last"] = last.fillna(cyc["req"]).astype("int64")
    cyc["wait_s"] = cyc["experienced_ttft_ms"].astype(float) / 1000.0 * scale
    cyc["violation"] = cyc["violation"].fillna(False).astype(bool)
    cyc["switched"] = False
    if len(ev) and len(cyc):
        ev = ev.sort_values(["participant_id", "ts_ns"], kind="stable").reset_index(drop=True)
        apps = ev["payload_json"].map(lambda p: (json.loads(p) or {}).get("app") if p else None)
        away = (ev["kind"] == "focus_out") & ~apps.fillna("").str.lower().isin(working)
        nxt = ev.groupby("participant_id")["ts_ns"].shift(-1)
        dur = ev["duration_s"].astype(float).where(ev["duration_s"].notna(),
                                                   (nxt - ev["ts_ns"]) / 1e9)
        outs = ev[away & (dur * scale >= config.capture.switch_min_away_s)][
            ["participant_id", "ts_ns"]].astype({"participant_id": object, "ts_ns": "int64"})
        left = outs.sort_values("ts_ns")
        right = cyc[["id", "participant_id", "req", "last"]].astype(
            {"participant_id": object}).sort_values("req")
        hit = pd.merge_asof(left, right, left_on="ts_ns", right_on="req", by="participant_id",
                            direction="backward")
        hit = hit[hit["id"].notna() & (hit["ts_ns"] <= hit["last"])]
        cyc["switched"] = cyc["id"].isin(set(hit["id"]))
    return cyc[["id", "participant_id", "status", "wait_s", "violation", "switched"]]


@dataclass
class StudyGlance:
    """Counts and the switch rate by wait band."""

    cycles: int
    participants: int
    violations: int
    bands: list[dict[str, Any]]

    @property
    def violation_rate(self) -> float:
        return self.violations / self.cycles if self.cycles else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"cycles": self.cycles, "participants": self.participants,
                "violations": self.violations, "violation_rate": self.violation_rate,
                "switch_rate_by_wait": self.bands}


def study_glance(database: Database, bands_s: Sequence[float] = DEFAULT_BANDS_S) -> StudyGlance:
    """Cycles, participants with cycles, violations and switch rate by experienced-TTFT band."""
    c = cycle_switches(database)
    ok = c[c["status"] == "ok"]
    rows: list[dict[str, object]] = []
    edges = list(bands_s)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = ok[(ok["wait_s"] >= lo) & (ok["wait_s"] < hi)]
        n = len(m)
        k = int(m["switched"].sum())
        rows.append({"band": _band_label(lo, hi), "lo_s": lo, "hi_s": hi, "cycles": n,
                     "switches": k, "rate": k / n if n else None})
    return StudyGlance(cycles=len(c), participants=int(c["participant_id"].nunique()),
                       violations=int(c["violation"].sum()), bands=rows)
