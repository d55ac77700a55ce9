"""No traceback reaches a user: every command given the wrong kind of file, and each importer
given data the database cannot hold, prints one line naming the problem, exits 2 and writes
nothing (the study database's content is checksummed before and after)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowtrial.cli import app
from flowtrial.study.config import parse_study
from flowtrial.study.participants import enroll
from flowtrial.study.storage import init_db

T0 = "2026-11-20T10:00:00+00:00"
T0_NS = 1_795_687_200 * 1_000_000_000
HAS_OTEL = importlib.util.find_spec("opentelemetry") is not None


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite study with one enrolled participant, p01, and its study file."""
    d = tmp_path_factory.mktemp("bad-input")
    text = '[study]\nname = "bad-input"\ndesign = "parallel"\n\n[[arms]]\nname = "team"\n'
    (d / "study.toml").write_text(text)
    config = parse_study({"study": {"name": "bad-input", "design": "parallel"},
                          "arms": [{"name": "team"}]})
    database = init_db(d / "study.db", config, text)
    enroll(database, config, "p01")
    database.dispose()
    return d


def checksum(db: Path) -> str:
    """A digest of the database's content (every row of every table), WAL included."""
    conn = sqlite3.connect(db)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


def aw_export(event: Any) -> dict[str, Any]:
    return {"buckets": {"aw-watcher-window_h": {
        "id": "aw-watcher-window_h", "type": "currentwindow", "client": "aw-watcher-window",
        "hostname": "h", "events": [event]}}}


GOOD_EVENT = {"timestamp": T0, "duration": 5.0, "data": {"app": "Code", "title": "x"}}


def otlp_log(time_unix_nano: Any, **attrs: Any) -> dict[str, Any]:
    kv = [{"key": "event.name", "value": {"stringValue": "gemini_cli.user_prompt"}},
          *({"key": k, "value": v} for k, v in attrs.items())]
    return {"resourceLogs": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "gemini-cli"}}]},
        "scopeLogs": [{"scope": {"name": "gemini-cli"}, "logRecords": [
            {"timeUnixNano": str(time_unix_nano), "attributes": kv}]}]}]}


def deep(n: int = 100_000) -> str:
    return '{"buckets":' + "[" * n + "]" * n + "}"


#: name → (file name, file text)
AW_FILES: dict[str, str] = {
    "aw_year_9999": json.dumps(aw_export(dict(GOOD_EVENT, timestamp="9999-12-31T23:59:59Z"))),
    "aw_year_0001": json.dumps(aw_export(dict(GOOD_EVENT, timestamp="0001-01-01T00:00:00Z"))),
    "aw_non_object_event": json.dumps(aw_export(5)),
    "aw_lone_surrogate": json.dumps(aw_export(GOOD_EVENT)).replace('"x"', '"\\ud800"'),
    "aw_deep_nesting": deep(),
    "aw_1e999": json.dumps(aw_export(GOOD_EVENT)).replace("5.0", "1e999"),
    "aw_nan": json.dumps(aw_export(dict(GOOD_EVENT, duration=float("nan")))),
    "aw_infinity": json.dumps(aw_export(dict(GOOD_EVENT, duration=float("inf")))),
    "aw_duration_text": json.dumps(aw_export(dict(GOOD_EVENT, duration="long"))),
}
OTEL_FILES: dict[str, str] = {
    "otel_uint64_overflow": json.dumps(otlp_log(2**64 - 1)),
    "otel_year_2300": json.dumps(otlp_log(10_500_000_000 * 10**9)),
    "otel_deep_nesting": deep(),
    "otel_nan": json.dumps(otlp_log(T0_NS, x={"doubleValue": float("nan")})),
    "otel_1e999": json.dumps(otlp_log(T0_NS, x={"doubleValue": 1.0})).replace("1.0", "1e999"),
    "otel_lone_surrogate": json.dumps(otlp_log(T0_NS, x={"stringValue": "\ud800"})),
    "otel_non_object": "5\n",
    "otel_sdk_hrtime_overflow": json.dumps({
        "resource": {"attributes": {"service.name": "gemini-cli"}},
        "instrumentationScope": {"name": "gemini-cli"}, "hrTime": [10**12, 0],
        "body": "gemini_cli.user_prompt", "attributes": {"event.name": "x"}}),
}
#: what the one line must say, per case
AW_SAYS = {"aw_year_9999": "out of range", "aw_year_0001": "out of range",
           "aw_non_object_event": "not an event object", "aw_lone_surrogate": "surrogate",
           "aw_deep_nesting": "nested too deeply",
           "aw_1e999": "duration: a number that is not finite",
           "aw_nan": "duration: a number that is not finite",
           "aw_infinity": "duration: a number that is not finite",
           "aw_duration_text": "not a number of seconds"}
OTEL_SAYS = {"otel_uint64_overflow": "out of range", "otel_year_2300": "out of range",
             "otel_deep_nesting": "nested too deeply",
             "otel_nan": "doubleValue: a number that is not finite",
             "otel_1e999": "doubleValue: a number that is not finite",
             "otel_lone_surrogate": "surrogate",
             "otel_non_object": "neither an OTLP JSON", "otel_sdk_hrtime_overflow": "out of range"}


def not_a_database(d: Path) -> Path:
    (d / "notes.txt").write_text("hello, not a database\n")
    return d / "notes.txt"


def a_folder(d: Path) -> Path:
    (d / "folder.db").mkdir(exist_ok=True)
    return d / "folder.db"


def binary_junk(d: Path) -> Path:
    (d / "junk.db").write_bytes(os.urandom(4096))
    return d / "junk.db"


def unreadable(d: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root reads any file: permissions cannot make one unreadable")
    p = d / "locked.db"
    p.write_bytes(b"SQLite format 3\x00" + bytes(4080))
    p.chmod(0)
    return p


WRONG_DB: dict[str, tuple[Callable[[Path], Path], str]] = {
    "text_file": (not_a_database, "not a database"),
    "folder": (a_folder, "a folder, not a database"),
    "binary": (binary_junk, "not a database"),
    "unreadable": (unreadable, "cannot read it"),
}
#: every command that opens an existing study database: its arguments after --db
DB_COMMANDS: dict[str, list[str]] = {
    "status": [], "analyze": ["--out", "{d}/report"], "export": ["--out", "{d}/export"],
    "turns": [], "migrate": [], "persistence": [], "dashboard": [], "notebooks": [],
    "import-activitywatch": ["--participant", "p01", "--export", "{d}/aw.json"],
    "import-otel": ["--participant", "p01", "{d}/otel.jsonl"],
    "enroll": ["--study", "{d}/study.toml", "--participant", "p02"],
}


def run(args: list[str]) -> Any:
    return CliRunner().invoke(app, args, catch_exceptions=True)


def assert_one_line_refusal(result: Any, says: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    # a warning (e.g. from the study file) may precede it; the refusal is one error line
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output
    assert says in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("kind", WRONG_DB)
@pytest.mark.parametrize("command", DB_COMMANDS)
def test_wrong_kind_of_database(command: str, kind: str, tmp_path: Path, study: Path) -> None:
    make, says = WRONG_DB[kind]
    bad = make(tmp_path)
    (tmp_path / "study.toml").write_text((study / "study.toml").read_text())
    (tmp_path / "aw.json").write_text(json.dumps(aw_export(GOOD_EVENT)))
    (tmp_path / "otel.jsonl").write_text(json.dumps(otlp_log(T0_NS)) + "\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    digest = bad.read_bytes() if bad.is_file() and os.access(bad, os.R_OK) else None
    extra = [a.format(d=tmp_path) for a in DB_COMMANDS[command]]
    if command == "import-otel" and not HAS_OTEL:
        pytest.skip("needs the [telemetry] extra")
    assert_one_line_refusal(run([command, "--db", str(bad), *extra]), says)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    if digest is not None:
        assert bad.read_bytes() == digest


@pytest.mark.parametrize("case", [*AW_FILES, *OTEL_FILES])
def test_importer_refuses_bad_data(case: str, tmp_path: Path, study: Path) -> None:
    is_aw = case in AW_FILES
    if not is_aw and not HAS_OTEL:
        pytest.skip("needs the [telemetry] extra")
    path = tmp_path / f"{case}.json"
    path.write_text(AW_FILES[case] if is_aw else OTEL_FILES[case], encoding="utf-8")
    db = study / "study.db"
    before = checksum(db)
    args = (["import-activitywatch", "--db", str(db), "--participant", "p01", "--export",
             str(path)] if is_aw else
            ["import-otel", "--db", str(db), "--participant", "p01", str(path)])
    assert_one_line_refusal(run(args), (AW_SAYS | OTEL_SAYS)[case])
    assert checksum(db) == before


def test_good_files_still_import(tmp_path: Path, study: Path) -> None:
    """The control: the same files with good values are imported (so the refusals above are
    the values', not the harness's)."""
    aw = tmp_path / "aw.json"
    aw.write_text(json.dumps(aw_export(GOOD_EVENT)))
    db = study / "study.db"
    r = run(["import-activitywatch", "--db", str(db), "--participant", "p01", "--export",
             str(aw)])
    assert r.exit_code == 0, r.output
    if HAS_OTEL:
        otel = tmp_path / "otel.jsonl"
        otel.write_text(json.dumps(otlp_log(T0_NS)) + "\n")
        r = run(["import-otel", "--db", str(db), "--participant", "p01", str(otel)])
        assert r.exit_code == 0, r.output


def test_analyze_out_naming_a_file_is_refused_before_the_analysis(tmp_path: Path,
                                                                   study: Path) -> None:
    (tmp_path / "report").write_text("an existing file\n")
    r = run(["analyze", "--db", str(study / "study.db"), "--out", str(tmp_path / "report")])
    # the study has no cycles: had the analysis run first, it would say so instead
    assert_one_line_refusal(r, "a file is there, not a folder")
    assert (tmp_path / "report").read_text() == "an existing file\n"
    r = run(["export", "--db", str(study / "study.db"), "--out",
             str(tmp_path / "report" / "sub")])
    assert_one_line_refusal(r, "is a file, not a folder")


def test_enroll_refuses_a_database_in_a_missing_folder(tmp_path: Path, study: Path) -> None:
    target = tmp_path / "typo" / "dir" / "study.db"
    r = run(["enroll", "--study", str(study / "study.toml"), "--db", str(target),
             "--participant", "p01"])
    assert_one_line_refusal(r, f"mkdir -p {target.parent}")
    assert not (tmp_path / "typo").exists()
