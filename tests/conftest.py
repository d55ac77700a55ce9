"""Fixtures for running storage, proxy and analysis tests on both SQLite and PostgreSQL.

A test (or module, via ``pytestmark``) marked ``both_backends`` that uses the ``backend``
fixture — directly or through ``new_db``/``make_study`` — runs once per backend. The
PostgreSQL server is real (Debian's binaries, see ``tests/pg_server.py``), started once per
session on first use.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.pg_server import PgServer, start_server

BACKENDS = ("sqlite", "postgresql")


class _NoBareFolderImports(importlib.abc.MetaPathFinder):
    """The suite runs from the repository root, where `study/`, `analysis/`, … are also
    importable under their folder names; an installed flowtrial has only `flowtrial.*`.
    Refusing the bare names makes a leftover `import analysis` (or a string such as
    ``PackageLoader("analysis", …)``) fail here as it would for a user."""

    BARE = frozenset({"study", "instrumentation", "analysis", "dashboards"})

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> None:
        if fullname.split(".")[0] in self.BARE:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (flowtrial's packages are flowtrial.*)",
                name=fullname)
        return None


sys.meta_path.insert(0, _NoBareFolderImports())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_backends: run the test on SQLite and on a real PostgreSQL server")


#: A ``timing`` test (wall-clock bounds in ms) that fails an assertion runs again, fixtures
#: and all, up to this many times: on a shared 2-core machine another process can take the CPU
#: at the wrong moment. Each rerun is reported with its reason (``-ra`` lists them as R);
#: precision itself is judged by the benchmarks, not by these tests.
TIMING_RERUNS = 2


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Say why a ``timing`` test is run again (the plugin only counts reruns)."""
    if report.outcome != "rerun":
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    reason = crash.message if crash is not None else str(report.longrepr)
    line = f"RERUN {report.nodeid} (timing, busy machine?): {reason.splitlines()[0][:300]}"
    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if reporter is not None:
        reporter.write_line(line)
    else:
        sys.stderr.write(line + "\n")


_CONFIG: list[pytest.Config] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _CONFIG[:] = [config]
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=TIMING_RERUNS, reruns_delay=1,
                                              only_rerun=["AssertionError"]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_backends") is None:
        return
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True)
    if "module_backend" in metafunc.fixturenames:
        metafunc.parametrize("module_backend", BACKENDS, indirect=True, scope="module")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL cluster for the whole session."""
    try:
        server = start_server()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))  # CI installs PostgreSQL: not having it is a failure
        pytest.skip(str(exc))
    yield server
    server.remove()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """``sqlite`` unless the test is parametrized over both backends."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="module")
def module_backend(request: pytest.FixtureRequest) -> str:
    """Like ``backend``, for module-scoped fixtures (one shared database per backend)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="module")
def module_new_db(module_backend: str, tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Callable[[str], str | Path]:
    """``new_db`` for module-scoped fixtures."""

    def make(name: str = "study.db") -> str | Path:
        if module_backend == "postgresql":
            server: PgServer = request.getfixturevalue("pg_server")
            return server.new_database()
        return tmp_path_factory.mktemp("db") / name

    return make


@pytest.fixture
def new_db(backend: str, tmp_path: Path,
           request: pytest.FixtureRequest) -> Callable[[str], str | Path]:
    """``new_db(name)``: where to put a new, empty study database on this test's backend —
    a file path in ``tmp_path`` for SQLite, a fresh database's URL for PostgreSQL."""

    def make(name: str = "study.db") -> str | Path:
        if backend == "postgresql":
            server: PgServer = request.getfixturevalue("pg_server")
            return server.new_database()
        return tmp_path / name

    return make
