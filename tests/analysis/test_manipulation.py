"""The manipulation check on raw cycle rows with known upstream and send times: the miss in
real units, the time-scaled tolerance, whose fault, the per-arm rates and the verdict."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from flowtrial.analysis import AnalysisInputError
from flowtrial.analysis.manipulation import PROXY_PRECISION_MS, manipulation_check

T0 = 10**12  # t_request_ns of every cycle
MS = 1_000_000


def cycle(arm: str = "a", *, ttft: float | None = 100.0, tps: float | None = None,
          tokens: int = 50, up_first: float = 1.0, up_last: float | None = 2.0,
          first: float | None = None, last: float | None = None,
          delivery: str = "stream", stream: bool = True, status: str = "ok") -> dict:
    """One raw row; times in raw ms after the request. ``first``/``last`` default to the
    schedule (on time); ``violation_ms`` is derived like the proxy does."""
    due_first = ttft if ttft is not None else up_first
    first = due_first if first is None else first
    gap = 1000.0 / tps if tps else 0.0
    due_last = first + gap * (tokens - 1)
    if last is None:
        last = max(due_last, up_last or 0.0)
    if delivery == "all_at_once" or not stream:
        due = (ttft or 0.0) + (1000.0 * tokens / tps if tps else 0.0)
        last = first
        viol = max(0.0, first - due)
    else:
        lates = [last - due_last]
        if ttft is not None:
            lates.append(first - ttft)
        viol = max(0.0, *lates)
    span = (last - first) / 1000
    return {
        "arm": arm, "status": status, "shaped": True, "stream": stream,
        "t_request_ns": T0, "t_upstream_first_ns": T0 + int(up_first * MS),
        "t_upstream_last_ns": None if up_last is None else T0 + int(up_last * MS),
        "t_first_sent_ns": T0 + int(first * MS), "t_last_sent_ns": T0 + int(last * MS),
        "target_ttft_ms": ttft, "target_tps": tps, "target_delivery": delivery,
        "tokens_sent": tokens, "achieved_tps": (tokens - 1) / span if span > 0 else None,
        "violation": viol > PROXY_PRECISION_MS, "violation_ms": viol,
    }


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in ("t_upstream_last_ns",):
        df[c] = pd.array(df[c], dtype="Int64")
    return df


def arm(result, name: str = "a") -> dict:
    return next(r for r in result.by_arm if r["arm"] == name)


def test_on_time_cycles_pass_and_state_real_units() -> None:
    r = manipulation_check(frame([cycle(first=100.5) for _ in range(30)]), time_scale=10)
    assert r.ok and r.status == "ok" and not r.warnings
    a = arm(r)
    assert a["target_ttft_ms"] == pytest.approx(1000)  # 100 ms applied × 10
    assert a["experienced_ttft_ms"] == pytest.approx(1005)
    assert a["upstream_ttft_ms"] == pytest.approx(10)
    assert a["misses"] == 0 and a["miss_rate"] == 0
    assert "no shaped cycle missed" in r.summary and "5 ms raw × time_scale 10" in r.summary


def test_tolerance_follows_the_time_scale() -> None:
    """The same raw miss is judged against precision × s in real ms."""
    rows = [cycle(first=104.0)] * 10 + [cycle(first=106.0)] * 10  # 4 ms and 6 ms raw
    for s in (1.0, 75.0):
        r = manipulation_check(frame(rows), time_scale=s)
        assert r.tolerance_ms == pytest.approx(5 * s)
        a = arm(r)
        assert a["misses"] == 10  # only the 6 ms ones, at either scale
        assert a["miss_ms_median"] == pytest.approx(6 * s, rel=1e-3)
        assert a["miss_ms_max"] == pytest.approx(6 * s, rel=1e-3)
    # A looser raw precision (a busy machine) lets the 6 ms raw misses through.
    assert arm(manipulation_check(frame(rows), time_scale=75, precision_ms=8))["misses"] == 0


def test_upstream_late_first_token_is_the_upstreams_fault() -> None:
    rows = [cycle(up_first=400.0, up_last=401.0, first=400.3) for _ in range(25)]
    r = manipulation_check(frame(rows), time_scale=1)
    a = arm(r)
    assert a["misses_upstream"] == 25 and a["misses_proxy_machine"] == 0
    assert a["upstream_ttft_ms"] == pytest.approx(400)
    assert r.status == "flagged" and not r.ok
    assert "upstream was slower than the target in 25 of 25" in r.problems[0]
    assert "their misses median 300 ms, max 300 ms (real)" in r.problems[0]


def test_in_process_model_held_up_by_the_machine_is_proxy_machine() -> None:
    """The built-in model in the proxy's process at 10⁶ tokens/s and no TTFT of its own:
    its first text arriving after the due time means the machine held it up (the demo's
    case). Its own slower TTFT would make it the upstream's fault; without its speed the
    check cannot tell and keeps the arrival's verdict."""
    rows = [{**cycle(up_first=120.0, up_last=121.0, first=120.3), "upstream": "mock"}
            for _ in range(25)]
    df = frame(rows)
    machine = arm(manipulation_check(df, time_scale=75, model_speed=(0.0, 1e6)))
    assert machine["misses_proxy_machine"] == 25 and machine["misses_upstream"] == 0
    assert machine["upstream_ttft_ms"] == pytest.approx(120 * 75)  # still what arrived
    slow = arm(manipulation_check(df, time_scale=75, model_speed=(115.0, 1e6)))
    assert slow["misses_upstream"] == 25 and slow["misses_proxy_machine"] == 0
    unknown_speed = arm(manipulation_check(df, time_scale=75))
    assert unknown_speed["misses_upstream"] == 25
    # Another upstream's rows are judged by their arrival, model speed or not.
    other = frame([{**row, "upstream": "openai"} for row in rows])
    assert arm(manipulation_check(other, time_scale=75, model_speed=(0.0, 1e6))
               )["misses_upstream"] == 25


def test_proxy_late_with_the_upstream_on_time_is_proxy_machine() -> None:
    rows = ([cycle(up_first=5.0, first=140.0) for _ in range(20)]
            + [cycle(first=100.2) for _ in range(20)])
    r = manipulation_check(frame(rows), time_scale=75)
    a = arm(r)
    assert a["misses"] == 20 and a["misses_proxy_machine"] == 20 and a["misses_upstream"] == 0
    assert a["miss_ms_median"] == pytest.approx(40 * 75, rel=1e-3)
    # The upstream kept up: a warning naming the machine, not a flag blaming the upstream.
    assert r.ok and r.status == "warn" and not r.problems
    assert "proxy/machine was late in 20 of 40" in r.warnings[0]
    assert "time_scale 75" in r.warnings[0]
    assert r.misses["by_fault"] == {"upstream": 0, "proxy_machine": 20, "unknown": 0}


def test_slow_upstream_rate_per_arm() -> None:
    """A fast arm whose upstream cannot keep up: the last token is late, the upstream's own
    rate is below the target, and the report says the proxy can only slow delivery down."""
    fast = [cycle("fast", ttft=50, tps=1000, tokens=301, up_first=10, up_last=10 + 3000,
                  last=50 + 3000 + 0.2) for _ in range(25)]  # upstream at 100 tokens/s
    slow = [cycle("slow", ttft=50, tps=20, tokens=101, up_first=10, up_last=60)
            for _ in range(25)]  # upstream far ahead of 20 tokens/s
    r = manipulation_check(frame(fast + slow), time_scale=1)
    f, s = arm(r, "fast"), arm(r, "slow")
    assert f["target_tps"] == 1000 and f["upstream_tps"] == pytest.approx(100, rel=0.01)
    assert f["achieved_tps"] == pytest.approx(100, rel=0.01)
    assert f["misses_upstream"] == 25
    assert s["achieved_tps"] == pytest.approx(20, rel=0.01) and s["upstream_tps"] > 1000
    assert s["misses"] == 0
    assert any("arm fast" in p and "delivered 100 tokens/s" in p and "upstream was slower" in p
               for p in r.problems)
    assert any("arm fast" in n and "can only slow delivery down" in n for n in r.notes)
    assert not any("arm slow" in p for p in r.problems)


def test_rates_are_real_under_time_scale() -> None:
    rows = [cycle(ttft=50, tps=200, tokens=101, up_first=10, up_last=20) for _ in range(5)]
    a = arm(manipulation_check(frame(rows), time_scale=10))
    assert a["target_tps"] == pytest.approx(20)
    assert a["achieved_tps"] == pytest.approx(20, rel=0.01)
    assert a["upstream_tps"] == pytest.approx(1000, rel=0.01)  # 100 tokens in 10 ms raw


def test_all_at_once_and_unknown_fault() -> None:
    held = [cycle(ttft=100, tps=100, tokens=11, delivery="all_at_once", up_first=5,
                  up_last=300, first=300.5) for _ in range(10)]  # due 210: upstream late
    blind = [cycle("b", up_first=5, up_last=None, first=150.0) for _ in range(10)]
    blind = [{**row, "t_upstream_first_ns": None} for row in blind]
    df = frame(held + blind)
    df["t_upstream_first_ns"] = pd.array(df["t_upstream_first_ns"], dtype="Int64")
    r = manipulation_check(df)
    assert arm(r)["misses_upstream"] == 10
    assert arm(r)["miss_ms_median"] == pytest.approx(90.5, rel=1e-3)
    assert arm(r, "b")["misses_unknown"] == 10
    assert any("whose fault is unknown" in w for w in r.warnings)


def test_tiny_study_is_explained_not_overstated() -> None:
    """4 cycles, one 5.67 ms raw miss: the size of the miss is shown; no rate verdict."""
    rows = [cycle(first=100.3), cycle(first=100.8), cycle(first=100.1),
            cycle(first=105.67)]
    r = manipulation_check(frame(rows))
    a = arm(r)
    assert a["misses"] == 1 and a["miss_ms_max"] == pytest.approx(5.67, abs=0.01)
    assert r.status == "ok"  # 1 of 4 is not above 5 % beyond chance
    assert any("only 4 shaped cycle(s)" in n and "1 missed" in n for n in r.notes)
    assert "1 of 4 shaped cycles" in r.summary and "5.7 ms" in r.summary
    json.dumps(r.to_dict())


def test_no_shaped_cycles_and_bad_input() -> None:
    unshaped = frame([{**cycle(), "target_ttft_ms": None, "target_tps": None,
                       "target_delivery": None, "shaped": False} for _ in range(3)])
    with pytest.raises(AnalysisInputError, match="no shaped cycles among 3"):
        manipulation_check(unshaped)
    with pytest.raises(AnalysisInputError, match="no cycles"):
        manipulation_check(frame([cycle()]).iloc[:0])
    with pytest.raises(AnalysisInputError, match="violation_ms"):
        manipulation_check(frame([cycle()]).drop(columns=["violation_ms"]))
    with pytest.raises(AnalysisInputError, match="time_scale"):
        manipulation_check(frame([cycle()]), time_scale=0)


def test_errored_cycles_are_not_judged() -> None:
    rows = [cycle(first=100.1)] * 5 + [cycle(first=900.0, status="upstream_error")] * 5
    r = manipulation_check(frame(rows))
    assert arm(r)["shaped_cycles"] == 5 and arm(r)["cycles"] == 10 and arm(r)["misses"] == 0


def test_precision_is_the_proxys_violation_tolerance() -> None:
    from flowtrial.instrumentation.proxy.shaping import VIOLATION_TOLERANCE_MS

    assert PROXY_PRECISION_MS == VIOLATION_TOLERANCE_MS


def test_many_cycles_rate_threshold() -> None:
    """400 cycles: 3 % upstream misses pass, 20 % are flagged."""
    rng = np.random.default_rng(0)

    def study(rate: float) -> pd.DataFrame:
        return frame([cycle(up_first=300.0, first=300.2) if rng.random() < rate
                      else cycle(first=100.2) for _ in range(400)])

    assert manipulation_check(study(0.03)).ok
    assert not manipulation_check(study(0.20)).ok


def test_virtual_study_records_the_upstream_so_the_fault_is_known(tmp_path) -> None:
    """The virtual simulator's fast arm outruns its simulated model (time_scale 10): the
    misses are the upstream's, and the arm's upstream rate is below the target."""
    from flowtrial.analysis.metrics import read_frames
    from flowtrial.study.storage import open_db
    from tests.analysis.test_report import make_study

    database = open_db(make_study(tmp_path / "study.db", design="parallel", n=4, prompts=5))
    try:
        frames = read_frames(database)
    finally:
        database.dispose()
    r = manipulation_check(frames.cycles, time_scale=frames.time_scale)
    fast, slow = arm(r, "fast"), arm(r, "slow")
    assert fast["misses"] == fast["misses_upstream"] > 0 and fast["misses_unknown"] == 0
    assert fast["upstream_tps"] < fast["target_tps"] and slow["misses"] == 0
    assert any("arm fast" in n and "can only slow delivery down" in n for n in r.notes)
