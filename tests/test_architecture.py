"""The shape of the code: one import package, imports that run one way, a fast CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from flowtrial.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("flowtrial", "study", "instrumentation", "analysis", "dashboards")
HEAVY = ("pandas", "scipy", "sqlalchemy", "starlette", "streamlit", "uvicorn", "statsmodels")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _package_copy(into: Path) -> Path:
    """The package as it is installed (subpackages inside ``flowtrial/``), copied from the
    repository's folders: import-linter, like a wheel, needs one folder per package."""
    target = into / "flowtrial"
    shutil.copytree(ROOT / "flowtrial", target, ignore=shutil.ignore_patterns("__pycache__"))
    for name in PACKAGE_DIRS[1:]:
        shutil.copytree(ROOT / name, target / name,
                        ignore=shutil.ignore_patterns("__pycache__", "notebooks"))
    return into


def lint_imports(site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """import-linter (the [test] extra) on the package copy at ``site``, run by this Python
    (its `lint-imports` script may be a shell shim that a bare PATH cannot run)."""
    code = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, timeout=240)


def test_imports_run_one_way(tmp_path: Path) -> None:
    """import-linter's contracts in pyproject.toml: root → dashboards → analysis |
    instrumentation → study, and no package imports the composition root."""
    site = _package_copy(tmp_path / "site")
    proc = lint_imports(site, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    contracts = _pyproject()["tool"]["importlinter"]["contracts"]
    assert proc.stdout.count("KEPT") == len(contracts) >= 2, proc.stdout


def test_import_linter_catches_a_wrong_way_import(tmp_path: Path) -> None:
    """The contracts can fail: a study module importing the analysis breaks them."""
    site = _package_copy(tmp_path / "site")
    (site / "flowtrial" / "study" / "wrong_way.py").write_text(
        "from flowtrial.analysis import metrics  # noqa: F401\n", encoding="utf-8")
    proc = lint_imports(site, tmp_path)
    assert proc.returncode != 0
    assert "flowtrial.study.wrong_way -> flowtrial.analysis" in proc.stdout, proc.stdout


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for top in PACKAGE_DIRS:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join(rel if top == "flowtrial" else ("flowtrial", *rel)))
    assert found == listed


_HELP_PROBE = """
import contextlib, io, json, sys
argv, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["flowtrial", *argv]
from flowtrial.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main()
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "help": out.getvalue(), "heavy": sorted(
    m for m in heavy if m in sys.modules)}))
"""


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_imports_nothing_heavy(command: str | None) -> None:
    """`flowtrial --help` and `flowtrial CMD --help` load no pandas, scipy, SQLAlchemy,
    Starlette or Streamlit: a user asking for help waits for none of them."""
    argv = ["--help"] if command is None else [command, "--help"]
    proc = subprocess.run([sys.executable, "-c", _HELP_PROBE, json.dumps(argv),
                           json.dumps(HEAVY)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["code"] == 0
    assert "Usage: flowtrial" in got["help"]
    assert got["heavy"] == []


def test_listing_summaries_match_the_commands_docstrings() -> None:
    """The listing's summaries come from COMMANDS (so that listing imports nothing); each
    must equal the first paragraph of the command's own docstring."""
    import importlib
    import inspect

    for name, spec in COMMANDS.items():
        module, attr = spec.target.split(":")
        doc = inspect.getdoc(getattr(importlib.import_module(module), attr)) or ""
        first = " ".join(doc.split("\n\n")[0].split())
        assert spec.summary == first, name


def test_a_missing_extra_is_one_line_naming_the_extra() -> None:
    from flowtrial.cli import missing_extra_message

    exc = ModuleNotFoundError("No module named 'streamlit'", name="streamlit")
    assert missing_extra_message(exc) == (
        "this command needs streamlit, which comes with the [dashboard] extra: "
        "pip install 'flowtrial[dashboard]'")
    assert missing_extra_message(ModuleNotFoundError("x", name="nonsense")) is None


def test_wheel_holds_exactly_one_top_level_package(tmp_path: Path) -> None:
    """A built wheel installs `flowtrial` and nothing else at the top level."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("flowtrial-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"flowtrial"}
    for expected in ("flowtrial/cli.py", "flowtrial/study/storage.py",
                     "flowtrial/instrumentation/proxy/app.py", "flowtrial/analysis/report.py",
                     "flowtrial/dashboards/app.py", "flowtrial/dashboards/pages/arms.py",
                     "flowtrial/study/migrations/versions/0001_initial.py",
                     "flowtrial/analysis/templates/report.html.j2"):
        assert expected in names, expected
