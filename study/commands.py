"""The study's own commands: init, validate, enroll, status, export, migrate, turns.

Kept light at import time: each command imports what it needs inside its body, so that
``flowtrial CMD --help`` stays fast.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import FlowtrialError

console = Console()

StudyOpt = Annotated[Path, typer.Option("--study", help="The study file (study.toml).")]
DbOpt = Annotated[
    str, typer.Option("--db", help="Study database: a SQLite path or a SQLAlchemy URL.")
]


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example study file.")] = Path(
        "study.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    design: Annotated[str, typer.Option(
        "--design", help="per_prompt (each prompt draws its latency; no arms), or parallel / "
                         "crossover (two example arms).")] = "per_prompt",
) -> None:
    """Write a commented example study file to edit."""
    from .config import ALLOWED_UNITS, example_study_text

    if design not in ALLOWED_UNITS:
        raise FlowtrialError(f"--design {design!r}: use per_prompt, parallel or crossover")
    if path.exists() and not force:
        raise FlowtrialError(
            f"{path} already exists: pass --force to overwrite it, or choose another path")
    path.write_text(example_study_text(design), encoding="utf-8")  # type: ignore[arg-type]
    console.print(escape(f"Wrote {path}. Edit it, check it with `flowtrial validate --study "
                         f"{path}`, then enroll participants with `flowtrial enroll`."),
                  highlight=False, soft_wrap=True)


def _warn(lines: list[str], source: Path) -> None:
    err = Console(stderr=True)
    for line in lines:
        err.print(f"[yellow]warning:[/yellow] {escape(f'{source}: {line}')}", highlight=False,
                  soft_wrap=True)


def validate(study: StudyOpt) -> None:
    """Check a study file without touching any database: one line per problem (exit code 2),
    or a short summary of the design when it is valid."""
    from .config import describe_study, load_study, study_warnings

    config = load_study(study)  # raises ConfigError: one line per problem
    _warn(study_warnings(config), study)
    console.print(escape(f"{study}: valid."), highlight=False, soft_wrap=True)
    for line in describe_study(config):
        console.print(escape(f"  {line}"), highlight=False, soft_wrap=True)


def enroll(
    study: StudyOpt,
    db: DbOpt,
    participant: Annotated[str, typer.Option("--participant", help="Pseudonymous id, e.g. p01.")],
    consent_at: Annotated[
        str | None, typer.Option("--consent-at", help="ISO time consent was given (default now).")
    ] = None,
) -> None:
    """Enroll a participant: assigns arms and prints their API key once (only a hash is kept)."""
    from .config import load_study, study_warnings
    from .participants import enroll as do_enroll
    from .storage import init_db

    config = load_study(study)
    _warn(study_warnings(config), study)
    consent = None
    if consent_at is not None:
        try:
            consent = datetime.fromisoformat(consent_at)
        except ValueError:
            msg = f"--consent-at {consent_at!r} is not an ISO time like 2026-11-21T10:00"
            raise FlowtrialError(msg) from None
    database = init_db(db, config, study.read_text(encoding="utf-8"))
    p, key, assignments = do_enroll(database, config, participant, consent_at=consent)
    assigned = _assignment_text(config.study.design, assignments)
    console.print(f"Enrolled [bold]{p.id}[/bold]: {assigned}.")
    console.print("API key (shown once, give it to the participant):")
    # The key goes to stdout alone on its line so scripts can capture it.
    print(key)


def _assignment_text(design: str, assignments: list) -> str:  # type: ignore[type-arg]
    """What a participant was assigned, in the design's own words."""
    if design == "per_prompt" or not assignments:
        return "each prompt draws its own latency (per-prompt design)"
    if design == "parallel":
        return f"arm {assignments[0].arm}"
    order = " → ".join(a.arm for a in sorted(assignments, key=lambda a: a.period))
    return f"arms by period {order}"


def status(
    db: DbOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Show enrollment, assignments and cycles per arm, and the sample-ratio-mismatch check."""
    from .status import study_status
    from .storage import open_db

    st = study_status(open_db(db))
    if as_json:
        print(json.dumps(st.to_dict(), indent=2))
        return
    console.print(
        f"[bold]{st.name}[/bold]  design={st.design} unit={st.unit} "
        f"time_scale={st.time_scale:g}  participants={st.participants}  tasks={st.tasks}  "
        f"events={st.events}"
    )
    t = Table(title="Arms")
    t.add_column("arm")
    t.add_column("assigned", justify="right")
    statuses = sorted({s for c in st.cycles.values() for s in c} | {"ok"})
    for s_ in statuses:
        t.add_column(f"cycles {s_}", justify="right")
    for arm, counts in st.cycles.items():
        t.add_row(
            arm, str(st.assignments.get(arm, "-")), *(str(counts.get(s_, 0)) for s_ in statuses)
        )
    console.print(t)
    if st.srm is not None:
        flag = "[red]MISMATCH[/red]" if st.srm.flagged else "[green]ok[/green]"
        console.print(
            f"Sample-ratio check: χ²={st.srm.chi2:.2f} p={st.srm.p_value:.3g} {flag} "
            "(flagged below p=0.001)"
        )
    elif st.srm_skipped:
        console.print(f"Sample-ratio check: not applicable ({st.srm_skipped})")


def export(
    db: DbOpt,
    out: Annotated[Path, typer.Option("--out", help="Directory for the exported files.")] = Path(
        "flowtrial-export"
    ),
    fmt: Annotated[str, typer.Option("--format", help="csv or parquet.")] = "csv",
    deidentify: Annotated[
        bool,
        typer.Option("--deidentify", help="Drop content and titles; pseudonymize ids."),
    ] = False,
) -> None:
    """Export every table as CSV or Parquet (keys and their hashes are never exported)."""
    from .export import export_tables
    from .storage import open_db
    from .validation import check_output_dir

    if fmt not in ("csv", "parquet"):
        raise FlowtrialError(f"--format {fmt!r} is not supported: use csv or parquet")
    check_output_dir(out, "--out")
    database = open_db(db)
    counts = export_tables(database, out, fmt, deidentify)  # type: ignore[arg-type]
    t = Table(title=f"Exported to {out}")
    t.add_column("table")
    t.add_column("rows", justify="right")
    for name, n in counts.items():
        t.add_row(name, str(n))
    console.print(t)


def migrate(db: DbOpt) -> None:
    """Upgrade a study database made by an older flowtrial to this version's schema (opening
    it does this too; run it once before starting several proxies on one database)."""
    from .storage import database_url, display_url, migrate_database

    before, after = migrate_database(db)
    where = display_url(database_url(db))
    if before == after:
        console.print(f"{where}: already at schema version {after}; nothing to do.")
    else:
        console.print(f"{where}: upgraded from schema version {before} to {after}.")


def turns(db: DbOpt) -> None:
    """Rebuild the agent turns from the recorded cycles (older or imported data gets turns:
    kinds are inferred where the proxy recorded none)."""
    from .storage import database_url, display_url, open_db
    from .turns import rebuild_turns

    database = open_db(db)
    try:
        n = rebuild_turns(database)
    finally:
        database.dispose()
    console.print(f"{display_url(database_url(db))}: {n} turns rebuilt from the cycles.")
