"""CLI command of the dashboard (registered on `flowtrial` by the lead): ``dashboard``."""

from __future__ import annotations

from typing import Annotated

import typer

APP = "app.py"


def streamlit_command(db_url: str, port: int, host: str) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` argv and extra environment for ``db_url`` (also used by tests)."""
    import sys
    from pathlib import Path

    app = Path(__file__).resolve().parent / APP
    argv = [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.port", str(port), "--server.address", host,
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--", "--db", db_url]
    # Streamlit must not phone home, whatever the user's config says.
    env = {"FLOWTRIAL_DASHBOARD_DB": db_url, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    return argv, env


def dashboard(
    db: Annotated[str, typer.Option(
        "--db", help="Study database: a SQLite path or a PostgreSQL URL.")],
    port: Annotated[int, typer.Option("--port", help="Port to serve the dashboard on.")] = 8501,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on (default: this machine only).")] = "127.0.0.1",
) -> None:
    """Open the study dashboard (Streamlit): overview, flow timeline, arms, flow threshold
    and team view, read live from the study database."""
    import os
    import subprocess

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.storage import open_db

    if not 0 < port < 65536:
        typer.echo(f"error: --port {port}: use a port between 1 and 65535", err=True)
        raise typer.Exit(2)
    try:
        database = open_db(db)
    except FlowtrialError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    url = database.url
    database.dispose()
    argv, env = streamlit_command(url, port, host)
    typer.echo(f"flowtrial dashboard on http://{host}:{port} (Ctrl-C stops it)", err=True)
    try:
        code = subprocess.call(argv, env={**os.environ, **env})
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
