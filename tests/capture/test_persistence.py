"""Persistence (passive acceptance) of completions in later prompts, from fingerprints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.analysis.metrics import cycle_table
from flowtrial.instrumentation.capture_commands import persistence as persistence_command
from flowtrial.instrumentation.persistence import compute_persistence
from tests.capture.conftest import NS, T0_NS

COMPLETION = '''
def moving_average(values, window):
    """Mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    out = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out


def exponential_smoothing(values, alpha):
    """Simple exponential smoothing with factor alpha in (0, 1]."""
    if not 0 < alpha <= 1:
        raise ValueError("alpha must be in (0, 1]")
    level = values[0]
    smoothed = [level]
    for v in values[1:]:
        level = alpha * v + (1 - alpha) * level
        smoothed.append(level)
    return smoothed
'''
CONTEXT = "import math\n\nclass Series:\n    pass\n\n# helpers below\n"
OTHER = "def unrelated():\n    return [x * x for x in range(100) if x % 3 == 0]\n" * 3
HALF = COMPLETION[: len(COMPLETION) // 2]


def _s(t: float) -> int:
    return T0_NS + round(t * NS)


def _edited(text: str) -> str:
    # The participant renamed two variables and re-indented everything.
    return text.replace("total", "running").replace("level", "state").replace("    ", "  ")


@pytest.fixture
def study(make_study: Any) -> Any:
    s = make_study(participants=("p01", "p02"))
    # The completion, shown from t = 0 to 2 s; its own prompt is the surrounding file.
    s.add_cycle("c0", "p01", _s(0), _s(2), content=COMPLETION, prompt=CONTEXT)
    # Later prompts: verbatim (re-indented) at 40 s, edited at 130 s, half kept at 310 s,
    # gone at 610 s.
    s.add_cycle("c1", "p01", _s(40), _s(41), content="x", prompt=CONTEXT + COMPLETION.replace(
        "    ", "\t"))
    s.add_cycle("c2", "p01", _s(130), _s(131), content="y", prompt=CONTEXT + _edited(COMPLETION))
    s.add_cycle("c3", "p01", _s(310), _s(311), content="z", prompt=CONTEXT + HALF + OTHER)
    s.add_cycle("c4", "p01", _s(610), _s(611), content="w", prompt=CONTEXT + OTHER)
    # Another participant's prompt with the same code proves nothing for p01.
    s.add_cycle("q1", "p02", _s(615), _s(616), content="v", prompt=COMPLETION)
    return s


def _rows(study: Any, cid: str = "c0") -> dict[float, tuple[float, bool, str]]:
    return {iv: (score, bool(kept), against) for iv, score, kept, against in study.rows(
        "SELECT interval_s, score, persisted, checked_against FROM persistence "
        "WHERE cycle_id = :c", c=cid)}


def test_verbatim_edited_partly_kept_and_gone(study: Any) -> None:
    n = compute_persistence(study.database)
    rows = _rows(study)
    assert set(rows) == {30.0, 120.0, 300.0, 600.0}
    assert rows[30.0] == (1.0, True, "c1")  # whitespace changes keep every hash
    edited, half, gone = rows[120.0][0], rows[300.0][0], rows[600.0][0]
    assert 0.3 < edited < 0.95 and rows[120.0][2] == "c2"
    assert 0.3 < half < 0.7 and rows[300.0][2] == "c3"
    assert gone == 0.0 and rows[600.0][1] is False
    assert rows[120.0][1] == (edited >= 0.5) and rows[300.0][1] == (half >= 0.5)
    assert n == study.rows("SELECT count(*) FROM persistence")[0][0]


def test_idempotent_and_only_decided_windows(study: Any) -> None:
    # At 200 s only the 30 s windows of c0 (32-152 s) and c1 (71-191 s) have closed.
    assert compute_persistence(study.database, now_ns=_s(200)) == 2
    assert set(_rows(study)) == {30.0}
    total = compute_persistence(study.database)
    assert total > 0 and compute_persistence(study.database) == 0
    assert set(_rows(study)) == {30.0, 120.0, 300.0, 600.0}
    # No prompt of p01 in any window of c3 (311 s + 30…720 s): unknown, no rows at all.
    assert _rows(study, "c3") == {}


def test_code_already_in_its_own_prompt_does_not_count(make_study: Any) -> None:
    s = make_study()
    new_part = "\n\ndef brand_new_helper(a, b):\n    return [x + y for x, y in zip(a, b)]\n"
    s.add_cycle("a0", "p01", _s(0), _s(1), content=COMPLETION + new_part, prompt=COMPLETION)
    s.add_cycle("a1", "p01", _s(40), _s(41), content="x", prompt=COMPLETION)  # new part gone
    compute_persistence(s.database, intervals_s=[30])
    score, kept, _ = _rows(s, "a0")[30.0]
    assert score == 0.0 and not kept


def test_without_fingerprints_nothing_is_decided(make_study: Any) -> None:
    s = make_study({"capture": {"content": "none"}})
    s.add_cycle("n0", "p01", _s(0), _s(1))
    s.add_cycle("n1", "p01", _s(40), _s(41))
    assert compute_persistence(s.database) == 0


def test_analysis_reads_persistence_and_cli(study: Any, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(persistence_command)
    res = CliRunner().invoke(app, ["--db", str(study.db)])
    assert res.exit_code == 0, res.output
    assert "30 s" in res.output and "600 s" in res.output
    df = cycle_table(study.database).set_index("cycle_id")
    assert bool(df.loc["c0", "persisted_30s"]) is True
    assert bool(df.loc["c0", "persisted_600s"]) is False
    bad = CliRunner().invoke(app, ["--db", str(study.db), "--threshold", "0"])
    assert bad.exit_code == 2 and "--threshold" in bad.output
