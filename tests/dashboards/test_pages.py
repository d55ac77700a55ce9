"""Every page under Streamlit's AppTest on a small simulated study, and on an empty one."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import func, select
from streamlit.testing.v1 import AppTest

from flowtrial.study.schema import Cycle
from flowtrial.study.storage import open_db
from tests.dashboards.conftest import APP, PAGES


def app(db: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_DB", str(db))
    return AppTest.from_file(str(APP), default_timeout=60)


def render(at: AppTest, page: str) -> AppTest:
    (at if page == PAGES[0] and not at.session_state else at.switch_page(page)).run()
    assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
    assert not at.error, f"{page}: {[e.value for e in at.error]}"
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label))


def layers(spec: dict) -> list[dict]:
    """Every unit view of a Vega-Lite spec (layers and concatenations flattened)."""
    out = []
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            out += layers(sub)
    if "mark" in spec:
        out.append({**spec, "mark": spec["mark"] if isinstance(spec["mark"], dict)
                    else {"type": spec["mark"]}})
    return out


def chart_data(at: AppTest, field: str) -> tuple[dict, list[pd.DataFrame]]:
    """The Vega-Lite spec and data sets of the first chart that encodes ``field``."""
    import json

    import pyarrow as pa

    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if f'"field": "{field}"' in json.dumps(spec):
            frames = [pa.ipc.open_stream(d.data.data).read_pandas()
                      for d in chart.proto.datasets]
            return spec, frames
    raise AssertionError(f"no chart encodes {field!r}")


def count(db: Path, *where: object) -> int:
    database = open_db(db)
    with database.engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(Cycle).where(*where)).scalar_one()
    database.dispose()
    return int(n)


def test_every_page_renders_with_the_study_numbers(small_study: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(small_study, monkeypatch)
    render(at, PAGES[0])
    assert metric(at, "Participants enrolled") == "6"
    assert metric(at, "Cycles recorded") == f"{count(small_study):,}"
    assert any("Sample-ratio check" in s.value for s in [*at.success, *at.error])
    # The report's manipulation check: its summary line and its JSON keys as columns.
    assert any(s.value.startswith("Manipulation check") for s in [*at.success, *at.warning])
    manip = at.dataframe[1].value
    assert {"misses", "misses_upstream", "misses_proxy_machine", "upstream_ttft_ms",
            "miss_ms_max"} <= set(manip.columns)
    assert at.get("download_button"), "overview charts need a CSV download"

    render(at, "pages/timeline.py")
    pid = at.selectbox(key="timeline_participant").value
    day = at.selectbox(key="timeline_day").value
    assert pid and day
    assert int(metric(at, "Cycles this day")) == count(small_study, Cycle.participant_id == pid)

    render(at, "pages/arms.py")
    assert any("switch rate per arm" in d.label for d in at.get("download_button"))
    assert metric(at, "Task-time effect of").endswith("%")

    render(at, "pages/threshold.py")
    psi = metric(at, "Median personal threshold")
    assert psi == "—" or psi.endswith(" s")
    tau = metric(at, "Spread τ (log-sd)")
    assert tau == "—" or float(tau) >= 0
    assert any("switch-vs-wait" in d.label or "switch vs wait" in d.label
               for d in at.get("download_button"))

    render(at, "pages/team.py")
    assert metric(at, "People") == "6"


def test_filters_persist_across_pages(small_study: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(small_study, monkeypatch)
    render(at, PAGES[0])
    at.multiselect(key="_w_arms").set_value(["slow"]).run()
    table = at.dataframe[1].value  # manipulation check per arm
    assert list(table["arm"]) == ["slow"]
    assert int(table["cycles"].iloc[0]) == count(small_study, Cycle.arm == "slow")
    render(at, "pages/team.py")
    assert at.multiselect(key="_w_arms").value == ["slow"]
    render(at, PAGES[0])
    assert list(at.dataframe[1].value["arm"]) == ["slow"]


def test_empty_study_shows_an_empty_state(empty_study: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(empty_study, monkeypatch)
    for page in PAGES:
        render(at, page)
        assert any("No cycles recorded yet" in i.value and "3 participant" in i.value
                   for i in at.info), page
    render(at, PAGES[0])
    assert metric(at, "Participants enrolled") == "3"


def test_bad_database_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(tmp_path / "missing.db", monkeypatch)
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "no such database" in at.error[0].value


def test_timeline_draws_agent_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent study (3 calls per prompt): the timeline counts turns (one wait bar each;
    the segments inside are tests/analysis/test_turn_unit.py's)."""
    import tomllib

    from flowtrial.study.config import parse_study
    from flowtrial.study.schema import Turn
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db
    from tests.dashboards.conftest import parallel_text

    text = parallel_text()
    config = parse_study(tomllib.loads(text))
    path = tmp_path / "agent.db"
    db = init_db(path, config, text)
    simulate_virtual(db, config, SimParams(), 2, 1, 4, seed=5, agent_steps=3)
    db.dispose()
    at = app(path, monkeypatch)
    render(at, PAGES[0])
    render(at, "pages/timeline.py")
    pid = at.selectbox(key="timeline_participant").value
    database = open_db(path)
    with database.engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(Turn).where(
            Turn.participant_id == pid)).scalar_one()
    database.dispose()
    assert int(metric(at, "Agent turns this day")) == n == 4
    # One bar per turn spanning its wait, its model calls and tool gaps nested inside it: on
    # the same lane, thinner, within the wait bar's span (#17).
    spec, frames = chart_data(at, "lane")
    bars = pd.concat(frames, ignore_index=True).drop_duplicates(  # the ticks repeat the waits
        subset=["cycle_id", "phase", "start", "end"])
    assert set(bars.loc[bars["phase"].isin(["wait", "model call", "tool"]), "lane"]) == {
        "turn (wait)"}
    heights = {m["mark"].get("height") for m in layers(spec) if m["mark"]["type"] == "bar"}
    assert heights == {18, 8}
    waits = bars[bars["phase"] == "wait"]
    inner = bars[bars["phase"].isin(["model call", "tool"])]
    assert (inner["phase"] == "model call").sum() == 3 * n
    assert (inner["phase"] == "tool").sum() == 2 * n
    for _, seg in inner.iterrows():
        w = waits[waits["cycle_id"] == seg["cycle_id"]]
        assert len(w) == 1, "each nested segment belongs to one turn's wait bar"
        slack = pd.Timedelta(microseconds=1)  # wall times from two anchor conversions
        assert w["start"].iloc[0] - slack <= seg["start"] <= seg["end"] <= (
            w["end"].iloc[0] + slack)


def test_chat_only_timeline_has_one_wait_lane(small_study: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(small_study, monkeypatch)
    render(at, PAGES[0])
    render(at, "pages/timeline.py")
    _spec, frames = chart_data(at, "lane")
    bars = pd.concat(frames, ignore_index=True)
    assert not bars["phase"].isin(["model call", "tool"]).any()
    assert set(bars.loc[bars["phase"] == "wait", "lane"]) == {"wait"}


def test_arms_histograms_one_axis_per_measure_in_numeric_order(
        small_study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(small_study, monkeypatch)
    render(at, PAGES[0])
    render(at, "pages/arms.py")
    spec, _frames = chart_data(at, "range_s")
    views = spec["hconcat"]
    assert [v["title"] for v in views] == ["experienced TTFT", "total wait", "cycle time"]
    assert spec["resolve"]["scale"]["x"] == "independent"
    for v in views:
        order = v["encoding"]["x"]["sort"]
        lows = [float(lab.split("–")[0].lstrip("≥ ")) for lab in order]
        assert lows == sorted(lows), order  # numeric, not text, order
        assert v["encoding"]["x"]["title"] == f"{v['title']} (s)"
    # Rates are percentages like the report's, never raw fractions.
    for df in at.dataframe:
        for col in df.value.columns:
            if str(col).endswith("_rate"):
                assert all(str(x).endswith(" %") or x == "—" for x in df.value[col]), col


def test_tiny_study_reads_as_sentences(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four cycles: every page renders, and nothing reads "—–— s", "0.000000%" or "nan"."""
    import tomllib

    from flowtrial.study.config import parse_study
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db
    from tests.dashboards.conftest import parallel_text

    text = parallel_text()
    config = parse_study(tomllib.loads(text))
    path = tmp_path / "tiny.db"
    db = init_db(path, config, text)
    simulate_virtual(db, config, SimParams(), 2, 1, 2, seed=1)
    db.dispose()
    at = app(path, monkeypatch)
    for page in PAGES:
        render(at, page)
        shown = [*(m.value for m in at.metric), *(c.value for c in at.caption),
                 *(i.value for i in at.info), *(w.value for w in at.warning),
                 *(s.value for s in at.success), *(m.value for m in at.markdown)]
        for text_shown in shown:
            assert "—–—" not in text_shown and "0.000000" not in text_shown, (page, text_shown)
            assert " nan" not in text_shown.lower(), (page, text_shown)
        for df in at.dataframe:
            for col in df.value.columns:
                if str(col).endswith(("_rate", "_share")):
                    assert all(str(x).endswith(" %") or x in ("—", None)
                               for x in df.value[col]), (page, col)
    render(at, "pages/threshold.py")
    shown_ci = metric(at, "95 % CI")
    assert shown_ci in ("not estimated", "fitting…") or shown_ci.endswith(" s"), shown_ci
