"""Field-study commands: ``onboard`` (a participant's ready-to-paste assistant settings) and
``sync-activitywatch`` (run by the participant; core install only). docs/researchers/
field-study.md.

Heavy imports live inside the functions so ``flowtrial --help`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from flowtrial.study.errors import FlowtrialError

__all__ = ["onboard", "sync_activitywatch"]


def onboard(
    study: Annotated[Path, typer.Option("--study", help="The study file (study.toml).")],
    participant: Annotated[str, typer.Option("--participant", help="The participant's id.")],
    client: Annotated[str, typer.Option("--client", help="codex, claude-code, aider, …")],
    db: Annotated[str | None, typer.Option(
        "--db", help="Study database (checks the key belongs to the participant).")] = None,
    key_env: Annotated[str, typer.Option(
        "--key-env", help="Environment variable holding the participant's key (it is shown "
                          "once at enrollment; without it the settings carry a "
                          "placeholder).")] = "FLOWTRIAL_KEY",
) -> None:
    """Print a participant's ready-to-paste settings for one assistant (the same the
    participant page shows), with their key filled in when it is in $FLOWTRIAL_KEY."""
    from flowtrial.study.config import load_study
    from flowtrial.study.participants import participant_by_key, validate_participant_id

    from .client_recipes import DOC_KEY, recipe, render

    config = load_study(study)
    validate_participant_id(participant)
    try:
        r = recipe(client)
    except KeyError as exc:
        raise FlowtrialError(str(exc.args[0])) from None
    key = os.environ.get(key_env, "").strip() or None
    if key is not None and db is not None:
        from flowtrial.study.storage import open_db

        database = open_db(db)
        try:
            found = participant_by_key(database, key)
        finally:
            database.dispose()
        if found is None or found.id != participant:
            raise FlowtrialError(f"${key_env} is not {participant}'s key: set it to the key "
                                 "`flowtrial enroll` printed for them")
    print(f"# {r.title} settings for participant {participant} ({config.proxy.base_url})")
    for s in render(r, key=key or DOC_KEY, base_url=config.proxy.base_url):
        print(f"\n# {s.where} ({s.lang})")
        print(s.text, end="")


def sync_activitywatch(
    proxy: Annotated[str, typer.Option("--proxy", help="The study's proxy, e.g. "
                                                       "https://study.example.org.")],
    key: Annotated[str | None, typer.Option(
        "--key", help="Your participant key (default: $FLOWTRIAL_KEY).")] = None,
    aw: Annotated[str | None, typer.Option(
        "--aw", help="Your aw-server (default: the first that answers of "
                     "http://127.0.0.1:5600 and :5667, the Research Edition).")] = None,
) -> None:
    """Send your ActivityWatch data to the study: only what its capture policy allows, filtered
    on this machine (no window titles or web addresses unless the study keeps content)."""
    from .aw_sync import sync

    secret = (key or os.environ.get("FLOWTRIAL_KEY", "")).strip()
    if not secret:
        raise FlowtrialError("give your participant key with --key or $FLOWTRIAL_KEY")
    receipt = sync(proxy, secret, aw)
    held = receipt.get("held", {})
    print(f"Read {receipt.get('received', 0)} events from {receipt.get('aw_server')}, "
          f"{receipt.get('new', 0)} new. The study now holds {held.get('events', 0)} events "
          f"of yours (from {held.get('first')} to {held.get('last')}).")
