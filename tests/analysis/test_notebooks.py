"""The analysis notebooks run without error on small simulated studies (nbclient)."""

from __future__ import annotations

import os
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from flowtrial.study.config import example_study_text, parse_study
from flowtrial.study.simulator import SimParams, simulate_virtual
from flowtrial.study.storage import init_db

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "analysis" / "notebooks"
CASES = {  # notebook -> the design of the study it runs on
    "task_effects.ipynb": "parallel",
    "flow_threshold.ipynb": "per_prompt",
    "power.ipynb": "per_prompt",
}


def make_study(path: Path, design: str) -> Path:
    data = tomllib.loads(example_study_text())
    data["study"]["time_scale"] = 10
    if design != "per_prompt":
        data["study"]["design"] = design
        data["study"]["unit"] = "participant"
    cfg = parse_study(data)
    db = init_db(path, cfg)
    simulate_virtual(db, cfg, SimParams(), 8, tasks=4, prompts_per_task=8, seed=2)
    db.dispose()
    return path


def run_notebook(name: str, db: Path, workdir: Path) -> Any:
    env = {
        **os.environ,
        "FLOWTRIAL_DB": str(db),
        "FLOWTRIAL_N_BOOT": "20",
        "FLOWTRIAL_POWER_SIMS": "1",
        "FLOWTRIAL_POWER_PARTICIPANTS": "4",
        "FLOWTRIAL_POWER_PROMPTS": "20",
        # The kernel must import this checkout's packages whatever its working directory.
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    env.pop("MPLBACKEND", None)  # the kernel's inline backend shows the figures
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    client.execute(env=env)
    return nb


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """All notebooks, executed concurrently (each in its own kernel process)."""
    tmp = tmp_path_factory.mktemp("nb")
    dbs = {d: make_study(tmp / f"{d}.db", d) for d in set(CASES.values())}
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {name: pool.submit(run_notebook, name, dbs[design], tmp)
                   for name, design in CASES.items()}
        out: dict[str, Any] = {}
        for name, f in futures.items():
            try:
                out[name] = f.result()
            except Exception as exc:  # noqa: BLE001 - reported by that notebook's test
                out[name] = exc
        return out


@pytest.mark.parametrize("name", list(CASES))
def test_notebook_runs(name: str, executed: dict[str, Any]) -> None:
    nb = executed[name]
    if isinstance(nb, Exception):
        raise nb
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    expected = {"task_effects.ipynb": "fast vs slow: effect on task time",
                "flow_threshold.ipynb": "true ψ = 8.0 s",
                "power.ipynb": "false-positive rate"}[name]
    assert expected in text
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for o in outputs)
