"""CLI command functions for capture (registered on ``flowtrial`` by the lead):
``import-activitywatch`` → :func:`import_activitywatch`, ``persistence`` → :func:`persistence`.

Heavy imports live inside the functions so ``flowtrial --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DbOpt = Annotated[
    str, typer.Option("--db", help="Study database: a SQLite path or a SQLAlchemy URL.")
]


def _fail(message: str) -> typer.Exit:
    """Print one line on stderr and return the exit-2 exception to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def import_activitywatch(
    db: DbOpt,
    participant: Annotated[str, typer.Option("--participant",
                                             help="Participant id the data belongs to.")],
    server: Annotated[str | None, typer.Option(
        "--server", help="A running aw-server, e.g. http://127.0.0.1:5600.")] = None,
    export: Annotated[Path | None, typer.Option(
        "--export", help="An ActivityWatch export file (GET /api/0/export).")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only events starting at or after this ISO-8601 time (UTC if no "
                        "offset).")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Only events starting before this ISO-8601 time.")] = None,
) -> None:
    """Import a participant's ActivityWatch window, AFK, editor and browser data as focus
    events (idempotent: importing the same data twice adds nothing)."""
    from rich.console import Console
    from rich.table import Table

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.storage import open_db

    from .activitywatch import import_activitywatch as run

    if (server is None) == (export is None):
        raise _fail("give exactly one of --server URL or --export FILE.json")
    try:
        database = open_db(db)
        try:
            report = run(database, participant, server=server, export=export, since=since,
                         until=until)
        finally:
            database.dispose()
    except FlowtrialError as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"ActivityWatch → {report.participant_id} (from {report.source})")
    for col, justify in (("bucket", "left"), ("type", "left"), ("events read", "right"),
                         ("focus/AFK events", "right"), ("new", "right"), ("note", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for b in report.buckets:
        table.add_row(b.bucket, b.type, str(b.read), str(b.produced), str(b.new), b.note)
    table.add_row("total", "", str(sum(b.read for b in report.buckets)), str(report.produced),
                  str(report.new), "", style="bold")
    Console().print(table)


def persistence(
    db: DbOpt,
    threshold: Annotated[float, typer.Option(
        "--threshold", help="Share of a completion's fingerprint a later prompt must contain "
                            "for it to count as persisted.")] = 0.5,
    window_s: Annotated[float, typer.Option(
        "--window-s", help="Seconds after each checkpoint whose prompts are evidence.")] = 120.0,
) -> None:
    """Check whether each completion's text persists in the participant's later prompts at the
    study's persistence intervals (passive acceptance); adds only rows not yet decided."""
    from rich.console import Console
    from rich.table import Table
    from sqlalchemy import text

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.storage import open_db

    from .persistence import compute_persistence

    if not 0.0 < threshold <= 1.0:
        raise _fail(f"--threshold {threshold:g}: must be in (0, 1]")
    if window_s <= 0:
        raise _fail(f"--window-s {window_s:g}: must be > 0")
    try:
        database = open_db(db)
        try:
            n = compute_persistence(database, threshold=threshold, window_s=window_s)
            with database.engine.connect() as conn:
                rows = conn.execute(text(
                    "SELECT interval_s, count(*), sum(CASE WHEN persisted THEN 1 ELSE 0 END), "
                    "avg(score) FROM persistence "
                    "GROUP BY interval_s ORDER BY interval_s")).all()
        finally:
            database.dispose()
    except FlowtrialError as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"Persistence: {n} new row(s)")
    for col in ("interval", "completions checked", "persisted", "mean score"):
        table.add_column(col, justify="right")
    for iv, count, kept, score in rows:
        table.add_row(f"{iv:g} s", str(count), f"{(kept or 0) / count:.0%}",
                      f"{score or 0:.2f}")
    Console().print(table)


def import_otel(
    db: DbOpt,
    participant: Annotated[str, typer.Option("--participant",
                                             help="Participant id the telemetry belongs to.")],
    file: Annotated[Path, typer.Argument(
        help="OTLP JSON (a collector's file exporter output, one request per line, or one "
             "export request), or Gemini CLI's telemetry.outfile.")],
) -> None:
    """Import a coding agent's OpenTelemetry (Claude Code, Codex CLI, Gemini CLI) from an OTLP
    JSON file or Gemini CLI's outfile as events linked to the participant's cycles
    (idempotent: importing the same records twice adds nothing)."""
    from rich.console import Console
    from rich.table import Table

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.storage import open_db

    try:
        from .telemetry.importer import import_otel as run
    except ImportError as exc:
        raise _fail(f"{exc}: install the telemetry extra (pip install "
                    "'flowtrial[telemetry]')") from None
    try:
        database = open_db(db)
        try:
            report = run(database, participant, file)
        finally:
            database.dispose()
    except FlowtrialError as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"OpenTelemetry → {report.participant_id} ({report.records} records, "
                        f"{report.new} new events, {report.linked} linked to cycles)")
    table.add_column("event kind")
    table.add_column("new", justify="right")
    for kind, n in sorted(report.by_kind.items()):
        table.add_row(kind, str(n))
    Console().print(table)
    if report.relinked:
        Console().print(f"{report.relinked} earlier event(s) linked to their cycle")


def codex_notify(
    notification: Annotated[str, typer.Argument(
        help="The JSON Codex passes to its notify program (added by Codex itself).")],
    url: Annotated[str, typer.Option(
        "--url", help="The flowtrial proxy's root URL, e.g. http://127.0.0.1:8787.")],
    key_env: Annotated[str, typer.Option(
        "--key-env", help="Environment variable holding the participant's key (Codex's "
                          "env_key).")] = "FLOWTRIAL_API_KEY",
) -> None:
    """Send Codex CLI's end-of-turn notification to the proxy as agent telemetry (set it as
    Codex's notify program: docs/clients/telemetry.md)."""
    import os

    from .telemetry.notify import NotifyError, log_request, post

    key = os.environ.get(key_env)
    if not key:
        raise _fail(f"${key_env} is not set: it must hold the participant's key (as for "
                    "Codex's model provider)")
    try:
        post(url, key, log_request(notification))
    except NotifyError as exc:
        raise _fail(str(exc)) from None
