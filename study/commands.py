"""The study's own commands: init, validate, enroll, status, export, withdraw, migrate, turns.

Kept light at import time: each command imports what it needs inside its body, so that
``flowtrial CMD --help`` stays fast.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

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
    template: Annotated[str, typer.Option(
        "--template", help="flow-threshold (the example above, per --design) or "
                           "speed-vs-capability (a fast model, the same model slowed to a "
                           "slow model's measured latency, and the slow model: a "
                           "crossover).")] = "flow-threshold",
) -> None:
    """Write a commented example study file to edit."""
    from .config import example_study_text, speed_vs_capability_text

    if template not in ("flow-threshold", "speed-vs-capability"):
        raise FlowtrialError(f"unknown --template {template!r}: use flow-threshold or "
                             "speed-vs-capability")
    if design not in ("per_prompt", "parallel", "crossover"):
        raise FlowtrialError(f"--design {design!r}: use per_prompt, parallel or crossover")
    if template == "speed-vs-capability" and design != "per_prompt":
        raise FlowtrialError("--template speed-vs-capability writes a crossover study: leave "
                             "out --design (edit [study] design in the file to change it)")
    if path.exists() and not force:
        raise FlowtrialError(
            f"{path} already exists: pass --force to overwrite it, or choose another path")
    text = (speed_vs_capability_text() if template == "speed-vs-capability"
            else example_study_text(design))  # type: ignore[arg-type]
    path.write_text(text, encoding="utf-8")
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
        str | None, typer.Option("--consent-at", help=(
            "ISO time consent was given (default now; with a [consent] text: given on the "
            "participant page)."))
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


def _assignment_text(design: str, assignments: list[Any]) -> str:
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
    if st.withdrawn or st.awaiting_consent or st.refused_requests:
        console.print(f"participation: withdrawn={st.withdrawn}  awaiting consent="
                      f"{st.awaiting_consent}  requests refused before consent="
                      f"{st.refused_requests}")
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


def withdraw(
    db: DbOpt,
    participant: Annotated[str, typer.Option("--participant", help="The participant's id.")],
    delete: Annotated[bool, typer.Option(
        "--delete", help="Also delete every row of theirs in every table (one transaction).")
    ] = False,
) -> None:
    """Withdraw a participant: the proxy stops recording them at once (within a second);
    with --delete every row of theirs is deleted, leaving one audit line with row counts."""
    from .participation import withdraw as do_withdraw
    from .storage import open_db

    database = open_db(db)
    try:
        counts = do_withdraw(database, participant, delete_data=delete)
    finally:
        database.dispose()
    console.print(escape(f"{participant}: withdrawn; nothing more is recorded."),
                  highlight=False)
    if delete:
        rows = ", ".join(f"{t} {n}" for t, n in sorted(counts.items())) or "none"
        console.print(escape(f"Deleted {sum(counts.values())} rows ({rows})."),
                      highlight=False, soft_wrap=True)


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
    from .typing_window import typing_gaps, window_sensitivity

    database = open_db(db)
    try:
        n = rebuild_turns(database)
        gaps = typing_gaps(database)
    finally:
        database.dispose()
    console.print(f"{display_url(database_url(db))}: {n} turns rebuilt from the cycles.")
    if gaps:  # how much the turns hang on the typing window (docs/concepts/turns.md)
        counts = ", ".join(f"{w:g} s: {k}" for w, k in window_sensitivity(gaps))
        console.print(f"Typing-speed rule: {len(gaps)} user messages followed their "
                      f"conversation's answer; a window of {counts} would make them the "
                      "agent's (continuing the turn).")


def team_token(db: DbOpt) -> None:
    """Issue the team token of an observe study (printed once; the previous one stops
    working): every team member's agent sends its telemetry with it, and each person is
    stored under a salted pseudonym of their identity."""
    from .storage import open_db
    from .team import issue_team_token

    token = issue_team_token(open_db(db))
    console.print("Team token (shown once; set it in the agents' OTLP headers as "
                  "Authorization=Bearer …):")
    print(token)
