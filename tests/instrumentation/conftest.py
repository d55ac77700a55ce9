"""Shared fixtures for the instrumentation tests (kept generic: any test may use them)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flowtrial.study.config import StudyConfig, parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import Database, init_db


@dataclass
class StudySetup:
    """A study file's config, its database with enrolled participants, and their keys."""

    config: StudyConfig
    db: Path | str  # a SQLite file, or a PostgreSQL URL (``both_backends`` tests)
    database: Database
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The first participant's key."""
        return next(iter(self.keys.values()))

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        from sqlalchemy import text

        with self.database.engine.connect() as conn:
            return list(conn.execute(text(sql), params or {}))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_study(directory: Path, overrides: dict[str, Any] | None = None,
                participants: tuple[str, ...] = ("p01",), name: str = "study.db",
                where: str | Path | None = None) -> StudySetup:
    """A validated study (parallel design, one unshaped arm unless overridden), its database
    in ``directory`` (or at ``where``: a path or a PostgreSQL URL), enrolled participants and
    their keys."""
    data = _merge(
        {"study": {"name": "instrumentation-test", "design": "parallel"},
         "arms": [{"name": "team"}]},
        overrides or {},
    )
    config = parse_study(data)
    db = where if where is not None else directory / name
    database = init_db(db, config)
    keys = {pid: enroll(database, config, pid)[1] for pid in participants}
    return StudySetup(config, db, database, keys)


@pytest.fixture
def make_study(tmp_path: Path, new_db: Callable[[str], str | Path]
               ) -> Iterator[Callable[..., StudySetup]]:
    """``make_study(overrides: dict, participants=("p01",), name="study.db")``: see
    :func:`build_study`; databases live in the test's ``tmp_path``, or on the PostgreSQL test
    server when the test runs on ``both_backends``."""
    made: list[StudySetup] = []

    def make(overrides: dict[str, Any] | None = None,
             participants: tuple[str, ...] = ("p01",), name: str = "study.db") -> StudySetup:
        made.append(build_study(tmp_path, overrides, participants, name, new_db(name)))
        return made[-1]

    yield make
    for s in made:
        s.database.dispose()


@pytest.fixture(scope="module")
def make_study_module(tmp_path_factory: pytest.TempPathFactory,
                      module_new_db: Callable[[str], str | Path],
                      ) -> Iterator[Callable[..., StudySetup]]:
    """Like ``make_study`` but shared by a module's tests (one database, one setup cost)."""
    made: list[StudySetup] = []

    def make(overrides: dict[str, Any] | None = None,
             participants: tuple[str, ...] = ("p01",), name: str = "study.db") -> StudySetup:
        made.append(build_study(tmp_path_factory.mktemp("study"), overrides, participants, name,
                                module_new_db(name)))
        return made[-1]

    yield make
    for s in made:
        s.database.dispose()


@pytest.fixture
def fine_gil_switching() -> Iterator[None]:
    """Hand the GIL over every 0.5 ms instead of 5 ms while a test's in-process client and
    server threads compete for it, so server-side timing is not distorted by the client."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)
