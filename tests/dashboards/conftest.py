"""Small simulated studies for the dashboard tests (virtual simulator: well under a second)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from flowtrial.study.config import example_study_text, parse_study

os.environ["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"  # never phone home
APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
PAGES = ["pages/overview.py", "pages/timeline.py", "pages/arms.py", "pages/threshold.py",
         "pages/team.py"]


def parallel_text() -> str:
    return example_study_text("parallel")


def simulated_parallel_study(target: Path | str, participants: int, tasks: int,
                             prompts: int) -> None:
    """The example parallel study at ``target`` (a path or URL), simulated virtually with
    seed 3: ``participants`` × ``tasks`` × ``prompts`` cycles."""
    from flowtrial.study.simulator import SimParams, simulate_virtual
    from flowtrial.study.storage import init_db

    text = parallel_text()
    config = parse_study(tomllib.loads(text))
    db = init_db(target, config, text)
    simulate_virtual(db, config, SimParams(), participants, tasks, prompts, seed=3)
    db.dispose()


@pytest.fixture(scope="session")
def small_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A parallel two-arm study: 6 participants × 2 tasks × 10 prompts = 120 cycles."""
    path = tmp_path_factory.mktemp("dash") / "small.db"
    simulated_parallel_study(path, 6, 2, 10)
    return path


@pytest.fixture(scope="session")
def empty_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A brand-new study: 3 enrolled participants, no cycles."""
    from flowtrial.study.simulator.records import enroll_simulated
    from flowtrial.study.storage import init_db

    path = tmp_path_factory.mktemp("dash") / "empty.db"
    text = parallel_text()
    config = parse_study(tomllib.loads(text))
    db = init_db(path, config, text)
    enroll_simulated(db, config, 3)
    db.dispose()
    return path
