"""``flowtrial proxy``: run the instrumented proxy in the foreground.

:func:`proxy_command` makes the command for a set of extensions: the composition root
(``flowtrial/proxy_assembly.py``) registers it with the set it chooses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flowtrial.study.errors import FlowtrialError

if TYPE_CHECKING:
    from .extensions import ProxyExtension

#: Builds the extensions a proxy serves (called once the command runs).
ExtensionsFactory = Callable[[], Sequence["ProxyExtension"]]


class ProxyCommandError(FlowtrialError):
    """Bad input to ``flowtrial proxy`` (the CLI prints it on one line and exits 2)."""


def proxy_command(extensions: ExtensionsFactory) -> Callable[..., None]:
    """The ``flowtrial proxy`` command serving ``extensions()``."""

    def proxy(
        study: Annotated[Path, typer.Option("--study", help="The study file (study.toml).")],
        db: Annotated[
            str, typer.Option("--db", help="Study database: a SQLite path or a SQLAlchemy URL.")
        ],
        host: Annotated[
            str | None,
            typer.Option("--host",
                         help="Interface to listen on (default: proxy.host, 127.0.0.1)."),
        ] = None,
        port: Annotated[
            int | None,
            typer.Option("--port",
                         help="Port to listen on (default: proxy.port, 8787; 0 = any)."),
        ] = None,
        instance: Annotated[
            str | None,
            typer.Option("--instance", help="Name recorded with each cycle "
                         "(cycles.recorded_by) when several proxies share one database "
                         "(default: host:pid)."),
        ] = None,
        workers: Annotated[
            int,
            typer.Option("--workers", help="Worker processes serving the port (each its own "
                         "event loop): more concurrent streams with precise timing on a "
                         "multi-core machine. Per-prompt draws never repeat across workers."),
        ] = 1,
    ) -> None:
        """Run the latency-shaping proxy: point participants' assistants at the URL it prints."""
        run_proxy(study, db, host, port, instance, workers, extensions())

    return proxy


def run_proxy(study: Path, db: str, host: str | None, port: int | None,
              instance: str | None, workers: int,
              extensions: Sequence[ProxyExtension]) -> None:
    """Run the proxy in the foreground until Ctrl-C (the body of ``flowtrial proxy``)."""
    import asyncio
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from flowtrial.study.config import load_study
    from flowtrial.study.storage import init_db

    from .app import GRACE_S, create_proxy_app
    from .extensions import telemetry_off_note
    from .routing import missing_key_vars
    from .server import base_url_of, bind_socket, make_server
    from .state import close_writer, make_writer
    from .workers import MAX_WORKERS, run_workers

    config = load_study(study)
    if port is not None and not 0 <= port <= 65535:
        raise ProxyCommandError(f"--port {port} is not a port number: use 0-65535")
    if not 1 <= workers <= MAX_WORKERS:
        raise ProxyCommandError(f"--workers {workers} is out of range: use 1-{MAX_WORKERS} "
                                "(about one per CPU core)")
    missing = missing_key_vars(config)
    if missing:
        raise ProxyCommandError(
            f"environment variable {missing[0]} (upstream.api_key_env) is not set: export the "
            "upstream API key under that name before starting the proxy"
        )
    sock = bind_socket(host or config.proxy.host, config.proxy.port if port is None else port)
    database = init_db(db, config, study.read_text(encoding="utf-8"))
    url = base_url_of(sock)
    out = Console()
    err = Console(stderr=True)
    design = config.study.design
    out.print(f"[bold]flowtrial proxy[/bold] for study [bold]{config.study.name}[/bold] "
              f"({design}, upstream {config.upstream.kind}) listening on {url}", soft_wrap=True)
    note = telemetry_off_note(extensions)
    if note:
        err.print(note, soft_wrap=True, highlight=False, markup=False)
    if workers > 1:
        database.dispose()  # the workers open their own connections after the fork
        _print_urls(out, url, design == "observe")
        try:
            code = run_workers(db, config, sock, workers, instance=instance, grace_s=GRACE_S,
                               extensions=extensions,
                               log=lambda m: err.print(m, soft_wrap=True, highlight=False))
        finally:
            sock.close()
        if code:
            raise typer.Exit(code)
        return
    writer = make_writer(database)
    app = create_proxy_app(database, config, writer=writer, instance=instance,
                           extensions=extensions)
    server = make_server(app, GRACE_S, config.proxy)
    _print_urls(out, url, design == "observe")

    def table() -> Table:
        t = Table(box=None, show_header=True, header_style="bold")
        for col in ("requests", "open streams", "cycles recorded", "errors", "writer queue"):
            t.add_column(col, justify="right")
        state = getattr(app.state, "proxy", None)
        if state is None:
            t.add_row("0", "0", "0", "0", "0")
            return t
        s = state.snapshot()
        t.add_row(str(s["requests"]), str(s["open_streams"]), str(s["cycles_recorded"]),
                  str(s["errors"]), str(s["writer_queue"]))
        return t

    class _Counter:
        def __rich__(self) -> Table:
            return table()

    started = time.monotonic()
    try:
        if out.is_terminal:
            with Live(_Counter(), console=out, refresh_per_second=4, transient=False):
                server.run(sockets=[sock])
        else:
            server.run(sockets=[sock])
    except KeyboardInterrupt:  # a second Ctrl-C: uvicorn gave up waiting; still drain below
        pass
    except asyncio.CancelledError:
        pass
    finally:
        close_writer(writer)
        sock.close()
        database.dispose()
    state = getattr(app.state, "proxy", None)
    if state is not None:
        s = state.snapshot()
        err.print(f"Stopped after {time.monotonic() - started:.0f} s: {s['requests']} requests, "
                  f"{s['cycles_recorded']} cycles recorded, {s['errors']} errors.")


def _print_urls(out: object, url: str, observe: bool = False) -> None:
    from rich.console import Console

    assert isinstance(out, Console)
    if observe:  # a team study: no model traffic through the proxy, only telemetry
        out.print("Team study (observe): point the agents' OpenTelemetry at it with the team "
                  "token (docs/operators/team-rollout.md):", soft_wrap=True)
        print(f"OTEL_EXPORTER_OTLP_ENDPOINT={url}/flowtrial/otlp", flush=True)
        out.print(f"Health: GET {url}/flowtrial/v1/health   Stop: Ctrl-C", soft_wrap=True,
                  highlight=False)
        return
    out.print("Point each participant's assistant at it, with their own key as the API key:",
              soft_wrap=True)
    # Plain prints so scripts (and tests) can read the lines whatever the terminal.
    print(f"OPENAI_BASE_URL={url}/v1", flush=True)
    print(f"ANTHROPIC_BASE_URL={url}", flush=True)
    out.print(f"Events: POST {url}/flowtrial/v1/events   Health: GET {url}/flowtrial/v1/health"
              "   Stop: Ctrl-C", soft_wrap=True, highlight=False)
