"""Switch classification on hand-built focus timelines (analysis.switches)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flowtrial.analysis.switches import classify_switches, normalize_app

NS = 1_000_000_000
T0 = 1_763_700_000 * NS
WORK = ["code", "terminal"]


def s(x: float) -> int:
    """Seconds after T0 as UTC epoch ns."""
    return T0 + int(round(x * NS))


def cycle(cid: str, pid: str, r: float, last: float | None) -> dict:
    return {"cycle_id": cid, "participant_id": pid, "t_request_wall_ns": s(r),
            "t_last_sent_wall_ns": None if last is None else s(last)}


def ev(pid: str, kind: str, t: float, app: str | None = None, category: str | None = None,
       source: str = "client") -> dict:
    return {"participant_id": pid, "kind": kind, "ts_ns": s(t), "app": app,
            "category": category, "source": source}


def classify(cycles: list[dict], events: list[dict], **kw) -> pd.DataFrame:
    kw.setdefault("min_away_s", 10.0)
    kw.setdefault("working_apps", WORK)
    cyc = pd.DataFrame(cycles)
    cyc["t_last_sent_wall_ns"] = pd.array(cyc["t_last_sent_wall_ns"], dtype="Int64")
    out = classify_switches(cyc, pd.DataFrame(events), **kw)
    assert list(out["cycle_id"]) == [c["cycle_id"] for c in cycles]
    return out.set_index("cycle_id")


def test_short_switch_counts_only_at_low_threshold() -> None:
    out = classify([cycle("c1", "p1", 0, 20)],
                   [ev("p1", "focus_out", 5, "firefox", "browser"),
                    ev("p1", "focus_in", 10, "code")])
    row = out.loc["c1"]
    assert bool(row["switched_2s"]) and not row["switched_10s"] and not row["switched"]
    assert not row["switched_30s"]
    assert row["time_away_s"] == 0 and row["resumption_lag_s"] == 0
    assert row["switch_category"] is None


def test_switch_straddling_last_sent_counts_whole_episode() -> None:
    out = classify([cycle("c1", "p1", 0, 12)],
                   [ev("p1", "focus_out", 8, "Firefox", "browser"),
                    ev("p1", "focus_in", 40, "code")])
    row = out.loc["c1"]
    assert row["switched"] and row["switched_30s"]
    assert row["time_away_s"] == pytest.approx(32)
    assert row["resumption_lag_s"] == pytest.approx(28)
    assert row["switch_category"] == "browser"


def test_switch_begun_before_request_or_after_last_sent_is_not_counted() -> None:
    out = classify(
        [cycle("before", "p1", 0, 12), cycle("after", "p2", 0, 12)],
        [ev("p1", "focus_out", -5, "slack", "chat"), ev("p1", "focus_in", 20, "code"),
         ev("p2", "focus_out", 12.5, "slack", "chat"), ev("p2", "focus_in", 60, "code")],
    )
    assert not out["switched"].any() and not out["switched_2s"].any()


def test_afk_time_is_excluded_and_reported() -> None:
    out = classify(
        [cycle("c1", "p1", 0, 30)],
        [ev("p1", "focus_out", 2, "firefox", "browser"),
         ev("p1", "afk_start", 4, source="activitywatch"),
         ev("p1", "afk_end", 100, source="activitywatch"), ev("p1", "focus_in", 105, "code")],
    )
    row = out.loc["c1"]
    # Away 2→105 s, of which 4→100 s AFK: 7 s not-AFK away < 10 s.
    assert row["switched_2s"] and not row["switched"]
    assert row["afk_overlap_s"] == pytest.approx(26)


def test_switch_starting_while_afk_starts_when_afk_ends() -> None:
    out = classify(
        [cycle("c1", "p1", 0, 25), cycle("c2", "p2", 0, 15)],
        [ev("p1", "afk_start", -1), ev("p1", "focus_out", 5, "mail", "email"),
         ev("p1", "afk_end", 20), ev("p1", "focus_in", 40, "code"),
         # p2: AFK throughout the episode: never a switch
         ev("p2", "afk_start", 1), ev("p2", "focus_out", 2, "mail"),
         ev("p2", "focus_in", 50, "code"), ev("p2", "afk_end", 60)],
    )
    assert out.loc["c1", "switched"] and out.loc["c1", "time_away_s"] == pytest.approx(20)
    assert out.loc["c1", "resumption_lag_s"] == pytest.approx(15)
    assert not out.loc["c2", "switched_2s"]
    assert out.loc["c2", "afk_overlap_s"] == pytest.approx(14)


def test_client_events_take_precedence_over_activitywatch() -> None:
    events = [
        # p1: the client says 5 s away; ActivityWatch (polled) says 28 s.
        ev("p1", "focus_out", 3, "firefox", "browser"), ev("p1", "focus_in", 8, "code"),
        ev("p1", "focus_out", 2, "firefox", source="activitywatch"),
        ev("p1", "focus_in", 30, "code", source="activitywatch"),
        # p2: only ActivityWatch: it is used.
        ev("p2", "focus_out", 2, "Slack.exe", source="activitywatch"),
        ev("p2", "focus_in", 30, "Code.exe", source="activitywatch"),
    ]
    out = classify([cycle("c1", "p1", 0, 20), cycle("c2", "p2", 0, 20)], events)
    assert not out.loc["c1", "switched"] and out.loc["c1", "switched_2s"]
    assert out.loc["c1", "switch_source"] == "client"
    assert out.loc["c2", "switched"] and out.loc["c2", "switch_source"] == "activitywatch"
    assert out.loc["c2", "time_away_s"] == pytest.approx(28)
    assert out.loc["c2", "switch_category"] == "Slack.exe"  # no category: the app


def test_activitywatch_fallback_when_client_silent_near_the_cycle() -> None:
    events = [
        # The client was running an hour before, not around this cycle.
        ev("p1", "focus_out", -3600, "firefox"), ev("p1", "focus_in", -3590, "code"),
        ev("p1", "focus_out", 2, "firefox", source="activitywatch"),
        ev("p1", "focus_in", 30, "code", source="activitywatch"),
    ]
    out = classify([cycle("c1", "p1", 0, 20)], events)
    assert out.loc["c1", "switched"] and out.loc["c1", "switch_source"] == "activitywatch"


def test_focus_moving_between_working_apps_is_not_a_switch() -> None:
    events = [ev("p1", "focus_out", 1, "Terminal"), ev("p1", "focus_in", 40, "code"),
              ev("p2", "focus_out", 1, "terminal"), ev("p2", "focus_in", 40, "code")]
    out = classify([cycle("c1", "p1", 0, 20), cycle("c2", "p2", 0, 20)], events,
                   participant_working_apps={"p2": ["code"]})
    assert not out.loc["c1", "switched_2s"]
    assert out.loc["c2", "switched"]  # p2's own list does not include the terminal


def test_later_long_episode_counts_after_a_short_one() -> None:
    events = [ev("p1", "focus_out", 1, "slack", "chat"), ev("p1", "focus_in", 4, "code"),
              ev("p1", "focus_out", 6, "firefox", "browser"), ev("p1", "focus_in", 21, "code")]
    out = classify([cycle("c1", "p1", 0, 25)], events)
    row = out.loc["c1"]
    assert row["switched"] and row["switch_category"] == "browser"
    assert row["time_away_s"] == pytest.approx(15) and row["resumption_lag_s"] == 0


def test_consecutive_away_apps_form_one_episode() -> None:
    events = [ev("p1", "focus_out", 1, "slack", "chat"), ev("p1", "focus_out", 5, "firefox"),
              ev("p1", "focus_in", 13, "code")]
    out = classify([cycle("c1", "p1", 0, 5)], events)
    assert out.loc["c1", "switched"] and out.loc["c1", "time_away_s"] == pytest.approx(12)
    assert out.loc["c1", "switch_category"] == "chat"


def test_time_scale_converts_to_real_seconds() -> None:
    # Raw 1.5 s away in a study compressed 10x is 15 real seconds.
    out = classify([cycle("c1", "p1", 0, 2)],
                   [ev("p1", "focus_out", 0.5, "firefox"), ev("p1", "focus_in", 2.0, "code")],
                   time_scale=10.0)
    assert out.loc["c1", "switched"] and not out.loc["c1", "switched_30s"]
    assert out.loc["c1", "time_away_s"] == pytest.approx(15)


def test_missing_last_sent_and_no_events() -> None:
    out = classify([cycle("c1", "p1", 0, None), cycle("c2", "p2", 0, 10)], [])
    assert not out["switched"].any()
    assert np.isnan(out.loc["c1", "time_away_s"]) and out.loc["c2", "time_away_s"] == 0
    assert out.loc["c2", "switch_source"] == "none"


def test_open_episode_closes_at_last_observation() -> None:
    out = classify([cycle("c1", "p1", 0, 30)], [ev("p1", "focus_out", 5, "firefox")])
    assert out.loc["c1", "switched"] and out.loc["c1", "time_away_s"] == pytest.approx(25)


def test_normalize_app() -> None:
    assert normalize_app("Code.exe") == "code"
    assert normalize_app(" iTerm2.app ") == "iterm2"
    assert normalize_app(None) is None


def test_vectorized_on_many_cycles_matches_loop() -> None:
    """A random timeline: the vectorized classification agrees with a direct per-cycle check."""
    rng = np.random.default_rng(3)
    cycles, events = [], []
    for p in range(5):
        t = 0.0
        for i in range(60):
            r = t
            last = r + rng.uniform(0.5, 40)
            cycles.append(cycle(f"p{p}c{i}", f"p{p}", r, last))
            if rng.random() < 0.5:
                out_t = rng.uniform(r, last)
                back = out_t + rng.lognormal(np.log(10), 1)
                events += [ev(f"p{p}", "focus_out", out_t, "firefox"),
                           ev(f"p{p}", "focus_in", back, "code")]
                t = back + rng.uniform(1, 30)
            else:
                t = last + rng.uniform(1, 30)
    out = classify(cycles, events)
    evdf = pd.DataFrame(events)
    for c in cycles:
        e = evdf[evdf["participant_id"] == c["participant_id"]]
        outs = e[e["kind"] == "focus_out"]["ts_ns"].to_numpy()
        ins = e[e["kind"] == "focus_in"]["ts_ns"].to_numpy()
        exp = any(c["t_request_wall_ns"] <= o <= c["t_last_sent_wall_ns"] and (i - o) >= 10 * NS
                  for o, i in zip(outs, ins, strict=True))
        assert bool(out.loc[c["cycle_id"], "switched"]) == exp


def test_resumption_lag_comes_from_the_counted_switch() -> None:
    """An 18 s switch that ends before the answer is ready, then a 1 s blip across
    t_last_sent: the counted switch gives no resumption lag (the blip is not the switch)."""
    s = 1_000_000_000
    t0 = 1_800_000_000 * s
    cycles = pd.DataFrame({"cycle_id": ["c1"], "participant_id": ["p"],
                           "t_request_wall_ns": [t0], "t_last_sent_wall_ns": [t0 + 30 * s]})
    ev = pd.DataFrame({
        "participant_id": ["p"] * 4,
        "kind": ["focus_out", "focus_in", "focus_out", "focus_in"],
        "ts_ns": [t0 + 2 * s, t0 + 20 * s, t0 + 29 * s + s // 2, t0 + 30 * s + s // 2],
        "app": ["firefox", "code", "slack", "code"],
        "category": ["browser", None, "chat", None],
        "source": ["client"] * 4,
    })
    out = classify_switches(cycles, ev, 10, ["code"])
    assert bool(out.loc[0, "switched"]) and out.loc[0, "time_away_s"] == pytest.approx(18.0)
    assert out.loc[0, "resumption_lag_s"] == 0.0
    # The same switch still in progress when the answer is ready: lag to its return.
    ev2 = ev.iloc[:2].copy()
    ev2.loc[1, "ts_ns"] = t0 + 41 * s
    out = classify_switches(cycles, ev2, 10, ["code"])
    assert out.loc[0, "resumption_lag_s"] == pytest.approx(11.0)
