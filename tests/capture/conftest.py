"""Fixtures for the capture tests: study databases, cycles on a known timeline, aw-server."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowtrial.instrumentation.fingerprints import fingerprint_json
from flowtrial.study.config import StudyConfig, parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.schema import Cycle
from flowtrial.study.storage import Database, WriteBatch, init_db, write_rows

NS = 1_000_000_000
# A fixed morning in the past: every window of every test has long closed.
T0 = datetime(2026, 11, 20, 10, 0, 0, tzinfo=UTC)
T0_NS = int(T0.timestamp()) * NS


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class Study:
    config: StudyConfig
    db: Path | str  # a SQLite file, or a PostgreSQL URL (``both_backends`` tests)
    database: Database
    keys: dict[str, str] = field(default_factory=dict)

    def rows(self, sql: str, **params: Any) -> list[Any]:
        from sqlalchemy import text

        with self.database.engine.connect() as conn:
            return list(conn.execute(text(sql), params))

    def add_cycle(self, cid: str, pid: str, request_ns: int, last_sent_ns: int | None = None,
                  *, content: str | None = None, prompt: str | None = None,
                  upstream_response_id: str | None = None, keep_text: bool = False) -> None:
        """A cycle whose wall times are the given UTC epoch ns (anchors cancel out)."""
        row: dict[str, Any] = {
            "id": cid, "participant_id": pid, "arm": "team", "protocol": "completions",
            "mono_anchor_ns": 1_000, "wall_anchor_ns": 1_000, "t_request_ns": request_ns,
            "t_first_sent_ns": request_ns + NS // 10 if last_sent_ns else None,
            "t_last_sent_ns": last_sent_ns, "t_done_ns": last_sent_ns,
            "started_at": datetime.fromtimestamp(request_ns / NS, UTC),
            "upstream_response_id": upstream_response_id,
            "content_fingerprint": fingerprint_json(content) if content is not None else None,
            "prompt_fingerprint": fingerprint_json(prompt) if prompt is not None else None,
            "content_text": content if keep_text else None,
            "prompt_text": prompt if keep_text else None,
            "content_chars": len(content) if content is not None else None,
        }
        write_rows(self.database, [WriteBatch(Cycle, [row])])


def build(directory: Path, overrides: dict[str, Any] | None = None,
          participants: tuple[str, ...] = ("p01",),
          working_apps: dict[str, list[str]] | None = None,
          where: str | Path | None = None) -> Study:
    data = merge({"study": {"name": "capture-test", "design": "parallel"},
                  "arms": [{"name": "team"}]}, overrides or {})
    config = parse_study(data)
    db = where if where is not None else directory / "study.db"
    database = init_db(db, config)
    keys = {pid: enroll(database, config, pid,
                        working_apps=(working_apps or {}).get(pid))[1] for pid in participants}
    return Study(config, db, database, keys)


@pytest.fixture
def make_study(tmp_path: Path, new_db: Callable[[str], str | Path]
               ) -> Iterator[Callable[..., Study]]:
    """Studies in ``tmp_path`` — or on the PostgreSQL test server for ``both_backends``."""
    made: list[Study] = []

    def make(overrides: dict[str, Any] | None = None,
             participants: tuple[str, ...] = ("p01",),
             working_apps: dict[str, list[str]] | None = None) -> Study:
        d = tmp_path / f"s{len(made)}"
        d.mkdir()
        made.append(build(d, overrides, participants, working_apps, new_db(f"{d}/study.db")))
        return made[-1]

    yield make
    for s in made:
        s.database.dispose()


def write_export(path: Path, buckets: dict[str, dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"buckets": buckets}), encoding="utf-8")
    return path


def aw_bucket(bid: str, type_: str, events: list[tuple[float, float, dict[str, Any]]],
              hostname: str = "devbox", client: str = "aw-watcher-test") -> dict[str, Any]:
    """An export-file bucket; events are (seconds after T0, duration s, data)."""
    return {
        "id": bid, "type": type_, "client": client, "hostname": hostname,
        "created": T0.isoformat(),
        "events": [{"timestamp": datetime.fromtimestamp(T0.timestamp() + at, UTC).isoformat(),
                    "duration": dur, "data": data} for at, dur, data in events],
    }


# --------------------------------------------------------------------------- aw-server


@dataclass
class AwServer:
    url: str
    port: int
    home: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def aw_env(home: Path) -> dict[str, str]:
    """XDG dirs inside ``home``: aw-server and aw-client keep nothing in the user's dirs."""
    return {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_STATE_HOME": str(home / "state")}


@pytest.fixture(autouse=True)
def _private_xdg_dirs(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """aw-client writes its config and lock files under the XDG dirs: never the user's."""
    home = tmp_path_factory.mktemp("xdg")
    for k, v in aw_env(home).items():
        if k != "HOME":
            monkeypatch.setenv(k, v)


@pytest.fixture(scope="module")
def aw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwServer]:
    """A real aw-server in testing mode on a free loopback port, data in a temp dir."""
    # find_spec, not import: importing aw_server writes its config into the user's dirs.
    if importlib.util.find_spec("aw_server") is None:
        pytest.skip("aw-server is not installed (it is in the test extras)")
    exe = shutil.which("aw-server")
    cmd = [exe] if exe else [sys.executable, "-m", "aw_server"]
    home = tmp_path_factory.mktemp("aw")
    port = _free_port()
    env = {**os.environ, **aw_env(home)}
    proc = subprocess.Popen([*cmd, "--testing", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"aw-server exited: {proc.stderr.read().decode()[-2000:]}"
                                   if proc.stderr else "aw-server exited")
            try:
                if httpx.get(f"{url}/api/0/info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("aw-server did not start within 30 s")
            time.sleep(0.1)
        yield AwServer(url, port, home)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
