"""CLI command of the dashboard (registered on `flowtrial` by the lead): ``dashboard``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

APP = "app.py"


def streamlit_command(db_url: str, port: int, host: str, allow_hosts: Sequence[str] = ()
                      ) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` argv and extra environment for ``db_url`` (also used by tests).

    The database URL travels in the environment, never in argv: a PostgreSQL URL carries its
    password, and any user on the machine can read a process's arguments."""
    import sys
    from pathlib import Path

    from .access import HOSTS_ENV, allowed_hosts

    app = Path(__file__).resolve().parent / APP
    argv = [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.port", str(port), "--server.address", host,
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            # A study dashboard, not an app to publish: no Deploy button, no developer menu.
            "--client.toolbarMode", "viewer"]
    # Streamlit must not phone home, whatever the user's config says.
    env = {"FLOWTRIAL_DASHBOARD_DB": db_url, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
           HOSTS_ENV: ",".join(allowed_hosts(host, allow_hosts))}
    return argv, env


def dashboard(
    db: Annotated[str, typer.Option(
        "--db", help="Study database: a SQLite path or a PostgreSQL URL.")],
    port: Annotated[int, typer.Option("--port", help="Port to serve the dashboard on.")] = 8501,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on (default: this machine only). Any other "
                       "address needs FLOWTRIAL_DASHBOARD_PASSWORD set.")] = "127.0.0.1",
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="A further host name the dashboard may be opened by (repeat "
                             "for more); other Host headers see nothing.")] = None,
) -> None:
    """Open the study dashboard (Streamlit): overview, flow timeline, arms, flow threshold
    and team view, read live from the study database."""
    import os

    from flowtrial.study.errors import FlowtrialError
    from flowtrial.study.extras import require
    from flowtrial.study.processes import port_in_use, run_child
    from flowtrial.study.storage import open_db

    from .access import PASSWORD_ENV, is_loopback

    if not 0 < port < 65536:
        typer.echo(f"error: --port {port}: use a port between 1 and 65535", err=True)
        raise typer.Exit(2)
    if not is_loopback(host) and not os.environ.get(PASSWORD_ENV):
        typer.echo(f"error: --host {host} would show every participant's data beyond this "
                   f"machine: set {PASSWORD_ENV} (each browser session must enter it) or "
                   "listen on 127.0.0.1", err=True)
        raise typer.Exit(2)
    try:
        require("dashboard", "flowtrial dashboard")
        database = open_db(db)
    except FlowtrialError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    url = database.url
    database.dispose()
    if port_in_use(host, port):
        typer.echo(f"error: --port {port}: another program is listening on {host}:{port}; "
                   "stop it or choose another --port", err=True)
        raise typer.Exit(2)
    argv, env = streamlit_command(url, port, host, allow_host or ())
    shown = f"[{host}]" if ":" in host else host
    guard = "" if is_loopback(host) else ", password required"
    typer.echo(f"flowtrial dashboard on http://{shown}:{port} (Ctrl-C stops it{guard})",
               err=True)
    try:
        code = run_child(argv, {**os.environ, **env})
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
