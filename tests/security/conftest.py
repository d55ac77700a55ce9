"""Helpers for the security tests: a study with enrolled participants, and the proxy app
served in-process (ASGI, lifespan running) through Starlette's test client."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from starlette.testclient import TestClient

from flowtrial.instrumentation.participant_page import PREFIX
from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.study.config import StudyConfig, parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import Database, init_db
from tests.instrumentation.conftest import _merge

# The in-process simulated model, as fast as it goes: fuzzing wants many requests.
FAST_MOCK = {"upstream": {"kind": "mock", "mock": {"tokens_per_second": 1e6, "ttft_ms": 0}}}
TABLES = ("cycles", "events", "tasks", "questionnaire_answers", "participants",
          "assignments", "persistence")


@dataclass
class Study:
    config: StudyConfig
    db: Path
    database: Database
    keys: dict[str, str] = field(default_factory=dict)

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        with self.database.engine.connect() as conn:
            return list(conn.execute(text(sql), params or {}))

    def count(self, table: str) -> int:
        return int(self.rows(f"SELECT COUNT(*) FROM {table}")[0][0])

    def counts(self) -> dict[str, int]:
        return {t: self.count(t) for t in TABLES}


def make_study(directory: Path, overrides: dict[str, Any] | None = None,
               participants: tuple[str, ...] = ("p01", "p02")) -> Study:
    """A parallel study (one unshaped arm unless overridden) with enrolled participants."""
    data = _merge({"study": {"name": "security-test", "design": "parallel"},
                   "arms": [{"name": "team"}]}, FAST_MOCK)
    config = parse_study(_merge(data, overrides or {}))
    db = directory / "study.db"
    database = init_db(db, config)
    keys = {pid: enroll(database, config, pid)[1] for pid in participants}
    return Study(config, db, database, keys)


@contextmanager
def proxy_client(study: Study) -> Iterator[TestClient]:
    """The proxy app in-process, lifespan running (writer, upstream), via Starlette's client."""
    app = create_proxy_app(study.database, study.config)
    with TestClient(app, raise_server_exceptions=False, follow_redirects=False) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def csrf_of(client: TestClient, path: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert m, f"no CSRF token on {path}"
    return m.group(1)


def login(client: TestClient, key: str) -> str:
    """Log ``client`` in on the participant page; returns its CSRF token."""
    r = client.post(f"{PREFIX}/login", data={"key": key})
    assert r.status_code == 303, r.text
    return csrf_of(client, f"{PREFIX}/")
