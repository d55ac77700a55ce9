"""Imported focus timelines, classified by ``flowtrial.analysis.switches`` through ``cycle_table``.

Hand-built ActivityWatch timelines (export files) and client events around cycles with known
waits: the switch at 2/10/30 s, where focus went, time away, resumption lag, AFK overlap and
which source wins when client and ActivityWatch events overlap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from flowtrial.analysis.metrics import cycle_table
from flowtrial.instrumentation.activitywatch import AFK, WINDOW, import_activitywatch
from flowtrial.study.schema import Event
from flowtrial.study.storage import WriteBatch, utcnow, write_rows
from tests.capture.conftest import NS, T0_NS, aw_bucket, write_export

H = 3600.0  # scenarios an hour apart: no scenario's events are near another's wait


def _at(s: float) -> int:
    return T0_NS + round(s * NS)


def _client_event(pid: str, kind: str, s: float, payload: dict[str, Any]) -> dict[str, Any]:
    return {"participant_id": pid, "cycle_id": None, "kind": kind, "ts_ns": _at(s),
            "duration_s": None, "source": "client", "payload_json": json.dumps(payload),
            "dedupe_key": None, "received_at": utcnow()}


@pytest.fixture
def table(make_study: Any, tmp_path: Path) -> dict[str, Any]:
    study = make_study(participants=("p01", "p02"))
    code, ff, slack = {"app": "Code", "title": "t"}, {"app": "firefox", "title": "t"}, {
        "app": "Slack", "title": "t"}
    p01 = write_export(tmp_path / "p01.json", {
        "win": aw_bucket("aw-watcher-window_a", WINDOW, [
            (-60, 65, code), (5, 20, ff), (25, 600, code),                      # C1
            (H - 10, 12, code), (H + 2, 4, slack), (H + 6, 600, code),          # C2
            (2 * H - 10, 15, code), (2 * H + 5, 45, ff), (2 * H + 50, 60, code),  # C3
            (3 * H - 20, 35, ff), (3 * H + 15, 60, code),                       # C5
        ]),
        "afk": aw_bucket("aw-watcher-afk_a", AFK, [
            (-60, 2 * H + 70, {"status": "not-afk"}), (2 * H + 10, 30, {"status": "afk"}),
            (2 * H + 40, H, {"status": "not-afk"})]),
    })
    p02 = write_export(tmp_path / "p02.json", {
        "win": aw_bucket("aw-watcher-window_b", WINDOW, [
            (4 * H - 30, 35, code), (4 * H + 5, 35, ff), (4 * H + 40, 60, code),  # C4
            (5 * H - 5, 7, code), (5 * H + 2, 18, ff), (5 * H + 20, 60, code),    # C6
        ]),
    })
    assert import_activitywatch(study.database, "p01", export=p01).new == 14
    assert import_activitywatch(study.database, "p02", export=p02).new == 6
    # p02's editor extension reports focus itself around C4 (exact, so it wins there).
    write_rows(study.database, [WriteBatch(Event, [
        _client_event("p02", "focus_out", 4 * H + 5, {"app": "firefox", "category": "browser"}),
        _client_event("p02", "focus_in", 4 * H + 8, {"app": "code"}),
    ])])
    for cid, pid, start, wait in (("C1", "p01", 0, 20), ("C2", "p01", H, 30),
                                  ("C3", "p01", 2 * H, 60), ("C5", "p01", 3 * H, 10),
                                  ("C4", "p02", 4 * H, 20), ("C6", "p02", 5 * H, 25)):
        study.add_cycle(cid, pid, _at(start), _at(start + wait))
    df = cycle_table(study.database)
    return {r["cycle_id"]: r for r in df.to_dict("records")}


def test_switch_during_wait_with_category_time_away_and_resumption_lag(table: Any) -> None:
    c1 = table["C1"]
    assert (c1["switched_2s"], c1["switched_10s"], c1["switched_30s"]) == (True, True, False)
    assert c1["switched"] and c1["switch_category"] == "browser"
    assert c1["time_away_s"] == pytest.approx(20.0)
    assert c1["resumption_lag_s"] == pytest.approx(5.0)  # back in Code 5 s after the answer
    assert c1["switch_source"] == "activitywatch"


def test_short_switch_counts_only_at_two_seconds(table: Any) -> None:
    c2 = table["C2"]
    assert (c2["switched_2s"], c2["switched_10s"], c2["switched_30s"]) == (True, False, False)
    assert pd.isna(c2["switch_category"])  # the main threshold (10 s) saw no switch
    assert c2["resumption_lag_s"] == 0.0


def test_afk_time_is_not_time_away(table: Any) -> None:
    c3 = table["C3"]
    # 45 s in Firefox, 30 s of them AFK: 15 s away.
    assert c3["time_away_s"] == pytest.approx(15.0)
    assert (c3["switched_10s"], c3["switched_30s"]) == (True, False)
    assert c3["afk_overlap_s"] == pytest.approx(30.0)


def test_focus_left_before_the_request_is_no_switch(table: Any) -> None:
    c5 = table["C5"]
    assert not (c5["switched_2s"] or c5["switched_10s"] or c5["switched_30s"])
    assert c5["time_away_s"] == 0.0


def test_client_events_take_precedence_over_activitywatch(table: Any) -> None:
    c4 = table["C4"]
    # ActivityWatch says 35 s in Firefox; the client, which saw focus exactly, says 3 s.
    assert c4["switch_source"] == "client"
    assert (c4["switched_2s"], c4["switched_10s"]) == (True, False)
    c6 = table["C6"]  # no client events near this wait: ActivityWatch decides
    assert c6["switch_source"] == "activitywatch"
    assert c6["switched_10s"] and c6["time_away_s"] == pytest.approx(18.0)
