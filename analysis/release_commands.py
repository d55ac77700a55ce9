"""``flowtrial export``: the raw tables (``flowtrial.study.commands.export``) or, with
``--release DIR``, the release package (:mod:`.release`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["export"]


def export(
    db: Annotated[str, typer.Option(
        "--db", help="Study database: a SQLite path or a SQLAlchemy URL.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the exported files.")] = Path(
        "flowtrial-export"),
    fmt: Annotated[str, typer.Option("--format", help="csv or parquet.")] = "csv",
    deidentify: Annotated[bool, typer.Option(
        "--deidentify", help="Drop content and titles; pseudonymize ids.")] = False,
    release: Annotated[Path | None, typer.Option(
        "--release", help="Write a de-identified Frictionless data package of the analysis "
                          "tables (per cycle, turn and task) with its codebook, README, "
                          "flowtrial version and study configuration hash into this "
                          "directory instead.")] = None,
) -> None:
    """Export every table as CSV or Parquet (keys and their hashes are never exported), or
    with --release a de-identified data package of the analysis tables with its codebook."""
    if release is None:
        from flowtrial.study.commands import export as export_tables

        export_tables(db, out, fmt, deidentify)
        return
    from rich.console import Console

    from flowtrial.study.storage import open_db

    from .release import write_release

    database = open_db(db)
    try:
        counts = write_release(database, release)
    finally:
        database.dispose()
    rows = ", ".join(f"{t} {n}" for t, n in counts.items())
    Console().print(f"Release package in {release} ({rows} rows): datapackage.json, "
                    "README.md", highlight=False, soft_wrap=True)
