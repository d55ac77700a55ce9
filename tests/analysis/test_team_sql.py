"""The team view's aggregates are computed in the database (bulk SQL turns, SQL weekly
aggregates); here they must agree with an independent pandas computation from the raw events
of a small generated team, on SQLite and PostgreSQL, and turns kept up batch by batch (as the
OTLP receiver does) must equal the bulk rebuild."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import text

from flowtrial.analysis.team import (
    WAIT_EDGES_S,
    TeamQuery,
    team_agents,
    team_wait_bins,
    team_weekly,
)
from flowtrial.study.config import parse_study
from flowtrial.study.simulator.team import COLUMNS, insert_events, simulate_team, team_events
from flowtrial.study.storage import Database, init_db
from flowtrial.study.team_rollup import RollupParams, rollup_params
from flowtrial.study.team_turns import rebuild_team_turns, refresh_team_turns

pytestmark = pytest.mark.both_backends

OBSERVE = '[study]\nname = "team"\ndesign = "observe"\n[upstream]\nkind = "mock"\n'
NS = 1_000_000_000
WEEK_NS = 7 * 86_400 * NS
TURN_COLS = ["participant_id", "agent", "start_ns", "end_ns", "wait_ns", "calls", "decided",
             "accepted", "gap_ns"]


def observe_db(new_db: Callable[[str], str | Path], name: str) -> Database:
    return init_db(new_db(name), parse_study(tomllib.loads(OBSERVE)), OBSERVE)


def events_frame(db: Database) -> pd.DataFrame:
    with db.engine.connect() as conn:
        return pd.read_sql(text("SELECT participant_id, kind, ts_ns, source, payload_json "
                                "FROM events"), conn)


def reference_turns(ev: pd.DataFrame) -> pd.DataFrame:
    """Turns from the raw events in pandas, from their definition (study/team_turns.py):
    a turn runs from a prompt to the person's next prompt in the same agent; its wait is
    prompt → last model request's end; gap to the person's next turn in any agent."""
    ev = ev[ev["source"] == "otel"].copy()
    ev["agent"] = ev["payload_json"].str.extract(r'"agent": "([^"]+)"', expand=False)
    ev = ev.sort_values(["participant_id", "agent", "ts_ns"], kind="stable")
    ev["seq"] = (ev["kind"] == "turn_start").groupby([ev["participant_id"],
                                                      ev["agent"]]).cumsum()
    rows = []
    for (pid, agent, _), g in ev[ev["seq"] > 0].groupby(["participant_id", "agent", "seq"]):
        start = int(g.loc[g["kind"] == "turn_start", "ts_ns"].min())
        calls = g[g["kind"] == "api_request"]
        if calls.empty:
            continue
        end = int(calls["ts_ns"].max())
        rows.append((pid, agent, start, end, float(end - start), len(calls),
                     int(g["kind"].isin(["accept", "reject"]).sum()),
                     int((g["kind"] == "accept").sum())))
    df = pd.DataFrame(rows, columns=TURN_COLS[:-1]).sort_values(["participant_id", "start_ns"])
    nxt = df.groupby("participant_id")["start_ns"].shift(-1)
    df["gap_ns"] = nxt - df["start_ns"]
    return df.reset_index(drop=True)


def stored_turns(db: Database) -> pd.DataFrame:
    with db.engine.connect() as conn:
        df = pd.read_sql(text(f"SELECT {', '.join(TURN_COLS)} FROM team_turns"), conn)
    return df.sort_values(["participant_id", "start_ns"]).reset_index(drop=True)


def reference_weekly(turns: pd.DataFrame, ev: pd.DataFrame, idle_s: float) -> pd.DataFrame:
    """Per person and week: waits, active hours, waiting share, switches during waits,
    acceptance — the team view's definitions, in pandas."""
    t = turns.copy()
    t["week"] = (t["start_ns"] + 3 * 86_400 * NS) // WEEK_NS
    t["active"] = np.where(t["gap_ns"].notna() & (t["gap_ns"] <= idle_s * NS),
                           t["gap_ns"], t["wait_ns"])
    outs = ev[ev["kind"] == "focus_out"]
    t["switches"] = [int(((o := outs[outs["participant_id"] == p])["ts_ns"] >= s).mul(
        o["ts_ns"] <= e).sum()) for p, s, e in zip(t["participant_id"], t["start_ns"],
                                                    t["end_ns"], strict=True)]
    g = t.groupby(["participant_id", "week"])
    out = pd.DataFrame({"waits": g.size(), "wait": g["wait_ns"].sum(),
                        "active": g["active"].sum(), "switches": g["switches"].sum(),
                        "decided": g["decided"].sum(), "accepted": g["accepted"].sum()})
    out["hours_active"] = out["active"] / NS / 3600
    out["waiting_share"] = out["wait"] / out["active"]
    out["acceptance_rate"] = (out["accepted"] / out["decided"]).where(out["decided"] > 0)
    return out.reset_index()


@pytest.mark.parametrize("idle_s", [600.0, 300.0], ids=["rollup", "raw"])
def test_sql_turns_and_weekly_view_agree_with_pandas_from_raw_events(new_db,
                                                                      idle_s: float) -> None:
    """At the study's idle limit (600 s) the view reads the weekly rollup; at another it
    aggregates the raw turns: both must equal pandas from the raw events."""
    db = observe_db(new_db, "team.db")
    simulate_team(db, 7, 3, turns_per_day=4, seed=3, focus_share=0.5)
    ev = events_frame(db)
    ref = reference_turns(ev)
    got = stored_turns(db)
    assert len(ref) == 7 * 3 * 5 * 4 == len(got)
    pd.testing.assert_frame_equal(got, ref, check_dtype=False)
    q = TeamQuery("telemetry", "person", idle_limit_s=idle_s,
                  dialect=db.engine.dialect.name)
    with db.engine.connect() as conn:
        assert (rollup_params(conn) == RollupParams(1.0, idle_s)) == (idle_s == 600.0)
        weekly, bins = team_weekly(conn, q), team_wait_bins(conn, q)
        agents = team_agents(conn, q)
    want = reference_weekly(ref, ev, q.idle_limit_s)
    assert len(weekly) == len(want) == 7 * 3
    weekly = weekly.sort_values(["who", "week"], ignore_index=True)
    for col in ("waits", "decided", "hours_active", "waiting_share", "acceptance_rate"):
        np.testing.assert_allclose(weekly[col].astype(float), want[col].astype(float),
                                   rtol=1e-9, err_msg=col)
    captured = weekly["switch_reason"] == ""
    assert 0 < captured.sum() < len(weekly)  # half the people have focus capture
    np.testing.assert_array_equal(weekly.loc[captured, "switches"],
                                  want.loc[captured.to_numpy(), "switches"])
    assert weekly.loc[~captured, "switches"].isna().all()  # unmeasured, never zero
    assert want.loc[captured.to_numpy(), "switches"].sum() > 0
    assert_bins_equal(bins, reference_bins(ref))
    assert int(agents["waits"].sum()) == len(ref) and set(agents["agent"]) == {
        "claude_code", "codex", "gemini_cli"}
    mean = ref.assign(agent=ref["agent"]).groupby("agent")["wait_ns"].mean() / NS
    np.testing.assert_allclose(agents.set_index("agent")["mean_wait_s"].sort_index(),
                               mean.sort_index(), rtol=1e-9)


def reference_bins(turns: pd.DataFrame) -> pd.DataFrame:
    """Waits per week and bin of ``WAIT_EDGES_S`` (real s = raw here), in numpy."""
    week = (turns["start_ns"] + 3 * 86_400 * NS) // WEEK_NS
    b = np.digitize(turns["wait_ns"] / NS, WAIT_EDGES_S[1:])
    return (pd.DataFrame({"week": week, "bin": b}).value_counts().rename("waits")
            .reset_index().sort_values(["week", "bin"], ignore_index=True))


def assert_weekly_equal(weekly: pd.DataFrame, want: pd.DataFrame) -> None:
    """The view's weekly rows (sorted by who and week) equal pandas': waits, active hours,
    waiting share, acceptance, and switches where focus was captured."""
    for col in ("waits", "hours_active", "waiting_share", "acceptance_rate"):
        np.testing.assert_allclose(weekly[col].astype(float), want[col].astype(float),
                                   rtol=1e-9, err_msg=col)
    cap = (weekly["switch_reason"] == "").to_numpy()
    np.testing.assert_array_equal(weekly.loc[cap, "switches"], want.loc[cap, "switches"])


def assert_bins_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    labels = pd.to_datetime(want["week"] * WEEK_NS - 3 * 86_400 * NS, utc=True)
    want = want.assign(week=labels.dt.strftime("%Y-%m-%d"))
    assert got[["week", "bin", "waits"]].values.tolist() == want[
        ["week", "bin", "waits"]].values.tolist()


def test_turns_kept_up_batch_by_batch_equal_the_bulk_rebuild(new_db) -> None:
    db = observe_db(new_db, "team.db")
    simulate_team(db, 3, 1, turns_per_day=6, seed=5, rebuild=False)
    rows = sorted(team_events(3, 1, 6, seed=5, received=None), key=lambda r: r[3])
    with db.engine.begin() as conn:  # the receiver's order: batches in time order
        conn.execute(text("DELETE FROM events"))
    received = ("2026-01-05 00:00:00.000000" if db.engine.dialect.name == "sqlite"
                else pd.Timestamp("2026-01-05", tz="UTC").to_pydatetime())
    rows = [(*r[:8], received) for r in rows]
    for i in range(0, len(rows), 7):  # batches that cut turns in the middle
        batch = rows[i:i + 7]
        with db.engine.begin() as conn:
            insert_events(conn, batch)
            for pid in {r[0] for r in batch}:
                refresh_team_turns(conn, pid, min(r[3] for r in batch if r[0] == pid))
    kept = stored_turns(db)
    with db.engine.begin() as conn:
        n = rebuild_team_turns(conn)
    assert n == len(kept) == 3 * 5 * 6
    pd.testing.assert_frame_equal(kept, stored_turns(db))
    assert kept["gap_ns"].isna().sum() == 3  # each person's last turn only
    assert dict(zip(COLUMNS, rows[0], strict=True))["source"] == "otel"


def test_reconcile_pairs_each_proxy_turn_once_with_the_nearest_telemetry_turn(new_db) -> None:
    """The candidates come from one SQL join; the pairing must be the one-to-one nearest
    match in time order, as computed here turn by turn in Python."""
    from flowtrial.analysis.team import MATCH_TOLERANCE_S, reconcile
    from flowtrial.study.schema import Turn

    db = observe_db(new_db, "team.db")
    simulate_team(db, 3, 1, turns_per_day=4, seed=11)
    tel = stored_turns(db).merge(_first_calls(db), on=["participant_id", "start_ns"])
    rng = np.random.default_rng(2)
    proxy = []
    for i, r in enumerate(tel[tel["participant_id"] != "t-0000000000000003"].itertuples()):
        for k in range(1 + (i % 3 == 0)):  # every third turn has a farther decoy too
            proxy.append({"id": f"p{i}-{k}", "participant_id": r.participant_id,
                          "arm": "a", "protocol": "openai", "mono_anchor_ns": 0,
                          "wall_anchor_ns": 0, "first_cycle_id": "c",
                          "t_start_ns": int(r.first_call_ns + rng.uniform(-0.5, 0.5) * NS
                                            + k * 1.2 * NS),
                          "started_at": pd.Timestamp("2026-01-05", tz="UTC").to_pydatetime(),
                          "wait_ms": float(rng.uniform(1000, 9000))})
    with db.engine.begin() as conn:
        conn.execute(Turn.__table__.insert(), proxy)  # type: ignore[attr-defined]
        got = reconcile(conn, TeamQuery("telemetry", dialect=db.engine.dialect.name))
    taken: set[str] = set()
    want = []
    for r in tel.sort_values(["participant_id", "start_ns"]).itertuples():
        near = [(abs(p["t_start_ns"] - r.first_call_ns), p["id"], p["wait_ms"]) for p in proxy
                if p["participant_id"] == r.participant_id and p["id"] not in taken
                and abs(p["t_start_ns"] - r.first_call_ns) <= MATCH_TOLERANCE_S * NS]
        best = min(near) if near else None
        if best:
            taken.add(best[1])
        want.append((best[1] if best else None, best[2] / 1000 if best else None))
    assert len(got) == len(tel) == 3 * 5 * 4
    assert [None if pd.isna(x) else x for x in got["proxy_turn_id"]] == [w[0] for w in want]
    matched = got["proxy_turn_id"].notna()
    assert matched.sum() == 2 * 5 * 4  # the third person has no proxy turns
    np.testing.assert_allclose(got.loc[matched, "wait_s"], [w[1] for w in want if w[0]])
    np.testing.assert_allclose(got.loc[matched, "diff_s"], got.loc[matched, "telemetry_span_s"]
                               - got.loc[matched, "proxy_wait_s"])


def _first_calls(db: Database) -> pd.DataFrame:
    with db.engine.connect() as conn:
        return pd.read_sql(text("SELECT participant_id, start_ns, first_call_ns "
                                "FROM team_turns"), conn)


def stored_rollup(db: Database) -> pd.DataFrame:
    with db.engine.connect() as conn:
        df = pd.read_sql(text("SELECT * FROM team_weeks"), conn)
    return df.sort_values(["participant_id", "agent", "model", "week"], ignore_index=True)


def test_rollup_kept_up_through_late_batches_equals_a_rebuild_and_pandas(new_db) -> None:
    """Batches of a team with focus capture arrive out of order (a day's batches late, one
    person's week after the next): the rollup kept up per batch equals the one rebuilt
    from scratch, and the view read from it equals pandas from the raw events."""
    from flowtrial.study.team import ensure_members

    db = observe_db(new_db, "team.db")
    rows = sorted(team_events(4, 2, 5, seed=8, focus_share=0.5, received=None),
                  key=lambda r: r[3])
    ensure_members(db, dict.fromkeys(r[0] for r in rows))
    received = ("2026-01-05 00:00:00.000000" if db.engine.dialect.name == "sqlite"
                else pd.Timestamp("2026-01-05", tz="UTC").to_pydatetime())
    rows = [(*r[:8], received) for r in rows]
    batches = [rows[i:i + 11] for i in range(0, len(rows), 11)]
    rng = np.random.default_rng(4)
    late = set(rng.choice(len(batches), len(batches) // 4, replace=False).tolist())
    order = [i for i in range(len(batches)) if i not in late] + sorted(late, reverse=True)
    for i in order:
        with db.engine.begin() as conn:
            insert_events(conn, batches[i])
            for pid in {r[0] for r in batches[i]}:
                refresh_team_turns(conn, pid, min(r[3] for r in batches[i] if r[0] == pid))
    kept = stored_rollup(db)
    with db.engine.begin() as conn:
        rebuild_team_turns(conn)
    pd.testing.assert_frame_equal(kept, stored_rollup(db))
    assert kept["captured"].any() and not kept["captured"].all()
    ev = events_frame(db)
    ref = reference_turns(ev)
    want = reference_weekly(ref, ev, 600.0)
    q = TeamQuery("telemetry", "person", idle_limit_s=600.0, dialect=db.engine.dialect.name)
    with db.engine.connect() as conn:
        weekly = team_weekly(conn, q).sort_values(["who", "week"], ignore_index=True)
        bins = team_wait_bins(conn, q)
    assert len(weekly) == len(want) == 4 * 2
    assert_weekly_equal(weekly, want)
    assert_bins_equal(bins, reference_bins(ref))


def test_a_date_range_cutting_weeks_reads_rollup_and_raw_edges(new_db) -> None:
    """From a Wednesday noon to a Tuesday two weeks later: the whole week in between comes
    from the rollup, the cut weeks from the raw turns; all equal pandas on the range."""
    db = observe_db(new_db, "team.db")
    simulate_team(db, 5, 4, turns_per_day=4, seed=6, focus_share=0.5)
    ev = events_frame(db)
    ref = reference_turns(ev)
    monday = 1_767_571_200 * NS  # the generator's first Monday
    lo, hi = monday + int(2.5 * 86_400 * NS), monday + 15 * 86_400 * NS
    q = TeamQuery("telemetry", "person", idle_limit_s=600.0, start_ns=lo, end_ns=hi,
                  dialect=db.engine.dialect.name)
    with db.engine.connect() as conn:
        weekly = team_weekly(conn, q).sort_values(["who", "week"], ignore_index=True)
        bins = team_wait_bins(conn, q)
    inside = ref[(ref["start_ns"] >= lo) & (ref["start_ns"] < hi)]
    want = reference_weekly(inside, ev, 600.0)
    assert sorted(set(weekly["week"])) == ["2026-01-05", "2026-01-12", "2026-01-19"]
    assert len(weekly) == len(want) == 5 * 3
    assert_weekly_equal(weekly, want)
    assert_bins_equal(bins, reference_bins(inside))


def test_upgrade_from_0011_fills_the_rollup_from_existing_turns(new_db) -> None:
    """A team database at schema 11 (turns, no rollup) opens at 12 with the rollup filled,
    equal to the one kept up by this version."""
    from alembic import command

    from flowtrial.study.migrate import _config
    from flowtrial.study.storage import open_db

    where = new_db("team.db")
    db = init_db(where, parse_study(tomllib.loads(OBSERVE)), OBSERVE)
    simulate_team(db, 4, 2, turns_per_day=3, seed=9, focus_share=0.5)
    want = stored_rollup(db)
    assert len(want) == 4 * 2
    with db.engine.begin() as conn:
        command.downgrade(_config(conn), "0011")
    with db.engine.connect() as conn:
        assert "team_weeks" not in conn.dialect.get_table_names(conn)
        assert conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")
                            ).scalar() == "11"
    db.dispose()
    db = open_db(where)  # upgrades
    pd.testing.assert_frame_equal(stored_rollup(db), want)


def test_activitywatch_import_updates_switches_in_the_rollup(new_db, tmp_path: Path) -> None:
    """Focus capture imported after the turns: the person's weeks gain switches (no longer
    "—"), equal to pandas over the imported focus events."""
    from flowtrial.instrumentation.activitywatch import import_activitywatch
    from tests.capture.conftest import T0, aw_bucket, write_export

    db = observe_db(new_db, "team.db")
    simulate_team(db, 2, 2, turns_per_day=3, seed=12)
    ref = reference_turns(events_frame(db))
    pid = "t-0000000000000001"
    mine = ref[ref["participant_id"] == pid]
    t0 = T0.timestamp()
    window = []
    for s, e in zip(mine["start_ns"][::2], mine["end_ns"][::2], strict=True):
        away = (s + 0.3 * (e - s)) / NS - t0  # a browser during the wait, then the editor
        window += [(away, 0.2 * (e - s) / NS, {"app": "firefox", "title": "x"}),
                   (away + 0.2 * (e - s) / NS, 5.0, {"app": "code", "title": "y"})]
    q = TeamQuery("telemetry", "person", idle_limit_s=600.0, dialect=db.engine.dialect.name)
    with db.engine.connect() as conn:
        assert team_weekly(conn, q)["switches"].isna().all()
    path = write_export(tmp_path / "aw.json",
                        {"w": aw_bucket("aw-watcher-window_devbox", "currentwindow", window)})
    import_activitywatch(db, pid, export=path)
    ev = events_frame(db)
    want = reference_weekly(ref, ev, 600.0)
    with db.engine.connect() as conn:
        weekly = team_weekly(conn, q).sort_values(["who", "week"], ignore_index=True)
    mine_w = (weekly["who"] == pid).to_numpy()
    assert (weekly.loc[mine_w, "switch_reason"] == "").all()
    assert weekly.loc[~mine_w, "switches"].isna().all()
    np.testing.assert_array_equal(weekly.loc[mine_w, "switches"], want.loc[mine_w, "switches"])
    assert want.loc[mine_w, "switches"].sum() == len(mine[::2])
