"""`flowtrial demo` measures the timer floor first and keeps its promise in the participants'
time: a busy machine makes it slower, never its manipulation check looser."""

from __future__ import annotations

import pytest

from flowtrial.analysis.manipulation import PROXY_PRECISION_MS
from flowtrial.demo_pace import (
    BASE_PRECISION_MS,
    DEMO_MIN_TIME_SCALE,
    DEMO_PROMISE_MS,
    DEMO_TIME_SCALE,
    FLOOR_FACTOR,
    DemoPace,
    choose_pace,
)


def test_a_quiet_machine_runs_at_full_speed_with_the_proxys_own_precision() -> None:
    pace = choose_pace([0.3] * 199 + [1.2])
    assert pace == DemoPace(DEMO_TIME_SCALE, BASE_PRECISION_MS, pace.floor_ms)
    assert not pace.adapted and pace.promise_ms == DEMO_PROMISE_MS == 375
    assert BASE_PRECISION_MS == PROXY_PRECISION_MS
    assert "time scale 75;" in pace.line() and "375 ms of the participants' time" in pace.line()


@pytest.mark.parametrize("floor", [2.0, 3.3, 5.0, 7.9])
def test_a_busy_machine_slows_the_demo_and_keeps_the_promise(floor: float) -> None:
    """The 99th percentile of the sleeps' lateness sets the raw precision (× FLOOR_FACTOR)
    and a whole time scale whose product with it is the same 375 ms."""
    lateness = [0.3] * 95 + [floor] * 5
    pace = choose_pace(lateness)
    assert pace.floor_ms == floor and pace.adapted
    assert pace.time_scale == int(pace.time_scale) < DEMO_TIME_SCALE
    assert pace.precision_ms * pace.time_scale == pytest.approx(DEMO_PROMISE_MS)
    assert pace.precision_ms >= FLOOR_FACTOR * floor
    line = pace.line()
    assert f"time scale {pace.time_scale:g} instead of 75" in line
    assert "375 ms of the participants' time" in line and "slowest" not in line
    assert "\n" not in line


def test_a_machine_too_busy_for_the_slowest_scale_is_told_the_check_may_warn() -> None:
    pace = choose_pace([40.0] * 100)
    assert pace.time_scale == DEMO_MIN_TIME_SCALE
    assert pace.precision_ms * pace.time_scale == pytest.approx(DEMO_PROMISE_MS)
    assert "the check may still warn" in pace.line()


def test_an_unmeasured_floor_or_a_given_scale_is_said() -> None:
    assert "could not be measured" in choose_pace([]).line()
    given = DemoPace(10.0, 5.0, None, given=True)
    assert "(given)" in given.line() and "50 ms of the participants' time" in given.line()


def test_the_floor_probe_measures_real_sleeps() -> None:
    from flowtrial.study.simulator.timing import timer_lateness_ms

    late = timer_lateness_ms(0.3)
    assert 10 <= len(late) <= 31  # 10 ms sleeps for 0.3 s, each at least 10 ms long
    assert all(x > -1.0 for x in late)  # a sleep never wakes (much) early


def test_the_demo_study_carries_the_pace() -> None:
    import tomllib

    from flowtrial.demo import demo_study_text
    from flowtrial.study.config import parse_study

    pace = choose_pace([0.3] * 95 + [3.3] * 5)
    text = demo_study_text(1, pace.time_scale, precision_ms=pace.precision_ms)
    study = parse_study(tomllib.loads(text)).study
    assert study.time_scale == pace.time_scale
    assert study.precision_ms * study.time_scale == pytest.approx(DEMO_PROMISE_MS, rel=1e-4)
