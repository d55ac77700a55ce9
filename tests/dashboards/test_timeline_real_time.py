"""The flow timeline of a compressed study is drawn in real time: each wait bar as long as
the real wait the metrics report, 24-hour UTC labels, the date when the range crosses a day."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pandas as pd
import pytest

from flowtrial.dashboards.real_time import axis_format, in_real_time, utc_label
from flowtrial.study.config import parse_study
from tests.dashboards.conftest import parallel_text
from tests.dashboards.test_pages import app, chart_data, layers, metric, render

SCALE = 75.0


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db

    text = (parallel_text().replace("time_scale = 1 ", f"time_scale = {SCALE:g} ")
            # a simulated model fast enough for the fast arm at 75× (its check passes)
            .replace("tokens_per_second = 2000", "tokens_per_second = 1000000")
            .replace("ttft_ms = 20\n", "ttft_ms = 0\n"))
    config = parse_study(tomllib.loads(text))
    assert config.study.time_scale == SCALE
    path = tmp_path_factory.mktemp("compressed") / "c.db"
    db = init_db(path, config, text)
    simulate_virtual(db, config, SimParams(), 2, 2, 10, seed=4)
    db.dispose()
    return path


def test_compressed_timeline_is_drawn_in_real_time(compressed: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(compressed, monkeypatch)
    render(at, "pages/overview.py")
    render(at, "pages/timeline.py")
    spec, frames = chart_data(at, "lane")
    bars = pd.concat(frames, ignore_index=True).drop_duplicates(
        subset=["cycle_id", "phase", "start", "end"])
    waits = bars[bars["phase"] == "wait"]
    assert len(waits) == 20
    drawn_s = (pd.to_datetime(waits["end"]) - pd.to_datetime(waits["start"])).dt.total_seconds()
    # each bar is the real total wait (the metrics' number), not the compressed 1/75 of it
    assert (drawn_s - waits["total_wait_s"]).abs().max() < 0.01
    minutes = float(metric(at, "Time waiting").split()[0])
    assert abs(drawn_s.sum() / 60 - minutes) < 0.1
    x = next(m["encoding"]["x"] for m in layers(spec) if m["mark"]["type"] == "bar")
    assert x["scale"]["type"] == "utc" and "%H" in x["axis"]["format"]
    assert "%I" not in x["axis"]["format"] and "%p" not in x["axis"]["format"]
    assert "real time (75× the recorded clock)" in x["title"]
    assert waits["start (UTC)"].str.fullmatch(r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d").all()


def test_stretch_and_labels() -> None:
    t0 = pd.Timestamp("2026-11-20 23:50:00", tz="UTC")
    seg = pd.DataFrame({"start": [t0, t0 + pd.Timedelta(seconds=10)],
                        "end": [t0 + pd.Timedelta(seconds=4), t0 + pd.Timedelta(seconds=20)]})
    real = in_real_time(seg, 75)
    assert list((real["end"] - real["start"]).dt.total_seconds()) == [300.0, 750.0]
    assert real["start"].iloc[0] == t0  # stretched from the first moment
    assert in_real_time(seg, 1) is seg
    # the real range (23:50 → 00:15 the next day) crosses midnight: labels carry the date
    fmt = axis_format(real["start"].min(), real["end"].max())
    assert fmt == "%Y-%m-%d %H:%M"
    assert axis_format(t0, t0 + pd.Timedelta(minutes=5)) == "%H:%M:%S"
    assert axis_format(t0 - pd.Timedelta(hours=5), t0) == "%H:%M"
    assert list(utc_label(real["end"], True)) == ["2026-11-20 23:55:00", "2026-11-21 00:15:00"]
    assert utc_label(pd.Series([pd.Timestamp("2026-11-20 17:13", tz="UTC")]),
                     False).iloc[0] == "17:13:00"
