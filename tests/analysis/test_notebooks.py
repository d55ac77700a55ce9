"""The analysis notebooks run without error on small simulated studies (nbclient), from
their own folder as Jupyter opens them, and find the demo's database without being told
where it is — from their folder and from the repository root."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
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
    data = tomllib.loads(example_study_text(design))  # type: ignore[arg-type]
    data["study"]["time_scale"] = 10
    if design != "per_prompt":
        data["study"]["design"] = design
        data["study"]["unit"] = "participant"
    cfg = parse_study(data)
    db = init_db(path, cfg)
    simulate_virtual(db, cfg, SimParams(), 8, tasks=4, prompts_per_task=8, seed=2)
    db.dispose()
    return path


def run_notebook(name: str, db: Path | None, workdir: Path, first_cells: int | None = None) -> Any:
    """Execute a notebook in ``workdir`` (Jupyter's folder). ``db`` None: no FLOWTRIAL_DB, the
    notebook finds the database itself. ``first_cells``: run only that many cells."""
    env = {
        **os.environ,
        "FLOWTRIAL_DB": str(db) if db is not None else "",
        "FLOWTRIAL_N_BOOT": "20",
        "FLOWTRIAL_POWER_SIMS": "1",
        "FLOWTRIAL_POWER_PARTICIPANTS": "4",
        "FLOWTRIAL_POWER_PROMPTS": "20",
        # The kernel must import this checkout's packages whatever its working directory.
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    env.pop("MPLBACKEND", None)  # the kernel's inline backend shows the figures
    if db is None:
        env.pop("FLOWTRIAL_DB")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    if first_cells is not None:
        nb.cells = nb.cells[:first_cells]
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
        # From the notebooks' own folder, where Jupyter starts when one opens them there.
        futures = {name: pool.submit(run_notebook, name, dbs[design], NOTEBOOKS)
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
    if name == "flow_threshold.ipynb":
        assert "Unit of waiting: the cycle (" in text
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for o in outputs)


def test_flow_threshold_notebook_waits_on_agent_turns(tmp_path: Path) -> None:
    """On a simulated agent study (3 calls per prompt) the notebook's waits are the turns,
    and it says so."""
    cfg = parse_study(tomllib.loads(example_study_text()))
    db = init_db(tmp_path / "agent.db", cfg)
    simulate_virtual(db, cfg, SimParams(), 3, tasks=1, prompts_per_task=4, seed=5,
                     agent_steps=3)
    db.dispose()
    nb = run_notebook("flow_threshold.ipynb", tmp_path / "agent.db", NOTEBOOKS, first_cells=3)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "Unit of waiting: the agent turn (12 turns from 36 cycles, 12 with several " \
           "model calls)" in text, text
    assert "12 completed waits from 3 participants" in text


def test_notebooks_find_the_demo_database_from_their_folder_and_from_the_root(
        tmp_path: Path) -> None:
    """No FLOWTRIAL_DB: the first cells find ``flowtrial-demo/flowtrial.db`` (where
    ``flowtrial demo`` writes it) from ``analysis/notebooks/`` and from the repository root of
    a checkout laid out like this one."""
    from flowtrial import demo
    from flowtrial.analysis import notebook_db

    assert (notebook_db.DEMO_DIR, notebook_db.DEMO_DB_NAME) == ("flowtrial-demo", demo.DB_NAME)
    root = tmp_path / "checkout"
    folder = root / "analysis" / "notebooks"
    folder.mkdir(parents=True)
    (root / "flowtrial-demo").mkdir()
    db = make_study(root / "flowtrial-demo" / "flowtrial.db", "per_prompt")
    with ThreadPoolExecutor(3) as pool:
        runs = {(name, where): pool.submit(run_notebook, name, None, where, 2)
                for name in CASES for where in (folder, root)}
        for (name, where), future in runs.items():
            nb = future.result()
            text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                           for o in c.get("outputs", []) if o.get("output_type") == "stream")
            assert f"Study database: {db}" in text, (name, where, text)
            assert "design=per_prompt" in text, (name, where, text)


def test_without_a_database_the_notebook_says_where_it_looked(tmp_path: Path) -> None:
    from nbclient.exceptions import CellExecutionError

    from flowtrial.analysis.notebook_db import find_demo_database

    if find_demo_database(tmp_path) is not None:  # a demo run in /tmp or above it
        pytest.skip("a flowtrial-demo/flowtrial.db lies above the temporary folder")
    with pytest.raises(CellExecutionError) as failure:
        run_notebook("flow_threshold.ipynb", None, tmp_path, first_cells=2)
    message = str(failure.value)
    assert "no study database: set FLOWTRIAL_DB" in message
    assert f"flowtrial-demo/flowtrial.db in {tmp_path.resolve()}" in message


def _start_notebooks(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str, str]:
    """Run `flowtrial notebooks … --no-browser` in its own session; return it, the URL (with
    token) Jupyter prints and everything printed up to it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtrial", "notebooks", *args, "--no-browser"], cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**{k: v for k, v in os.environ.items() if k != "FLOWTRIAL_DB"},
             "JUPYTER_CONFIG_DIR": str(cwd / ".jupyter"), "JUPYTER_DATA_DIR": str(cwd / ".jd"),
             "JUPYTER_RUNTIME_DIR": str(cwd / ".rt")})
    deadline = time.monotonic() + 120
    seen: list[str] = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"(http://127\.0\.0\.1:\d+/lab\?token=\w+)", line)
        if m:
            return proc, m.group(1), "".join(seen)
    os.killpg(proc.pid, signal.SIGTERM)
    raise AssertionError("Jupyter did not start:\n" + "".join(seen))


def _get_json(url: str) -> Any:
    """GET a Jupyter API URL; Jupyter prints its URL a moment before it accepts connections."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.load(r)["content"]
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_flowtrial_notebooks_starts_jupyter_on_the_notebooks(tmp_path: Path) -> None:
    pytest.importorskip("jupyterlab", reason="the [notebooks] extra installs JupyterLab")
    from tests.pg_server import free_port

    db = make_study(tmp_path / "study.db", "per_prompt")
    proc, url, printed = _start_notebooks(["--db", str(db), "--port", str(free_port())],
                                          tmp_path)
    try:
        assert f"reading {db}" in printed
        base, token = url.split("/lab?token=")
        names = {item["name"] for item in _get_json(f"{base}/api/contents?token={token}")}
        assert set(CASES) <= names, names  # Jupyter serves the notebooks' folder
        # Jupyter (and so every kernel it starts) has the database in FLOWTRIAL_DB.
        (server,) = _children(proc.pid)
        environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
        assert f"FLOWTRIAL_DB={db}".encode() in environ
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_flowtrial_notebooks_stops_jupyter_when_it_is_stopped(tmp_path: Path,
                                                              signame: str) -> None:
    """SIGTERM or Ctrl-C to `flowtrial notebooks` alone (not its process group) stops
    JupyterLab: no server left behind, and its port is free again."""
    pytest.importorskip("jupyterlab", reason="the [notebooks] extra installs JupyterLab")
    from flowtrial.study.processes import port_in_use
    from tests.pg_server import free_port

    db = make_study(tmp_path / "study.db", "per_prompt")
    port = free_port()
    proc, url, _ = _start_notebooks(["--db", str(db), "--port", str(port)], tmp_path)
    try:
        assert f":{port}/" in url
        _get_json(url.replace("/lab?", "/api/contents?"))  # serving
        (server,) = _children(proc.pid)
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=60) is not None
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)  # gone and reaped, not orphaned
        assert not port_in_use("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def test_flowtrial_notebooks_without_a_database_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flowtrial", "notebooks", "--db",
                           str(tmp_path / "missing.db")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {tmp_path / 'missing.db'}: no such database: create "
                                   "it with `flowtrial enroll --study …` or `flowtrial "
                                   "simulate`")
