"""The proxy as flowtrial runs it: the extensions it serves, chosen here (the composition
root), and the entry points that use them.

``flowtrial proxy`` (:data:`proxy`), ``python -m flowtrial.proxy_assembly`` (the same command
without the CLI: the kill -9 test, the benchmarks and the demo run it as its own process),
:func:`serve_proxy` (the live simulator) all serve :func:`standard_extensions`. A new
endpoint family (e.g. the OTLP telemetry receiver) is one entry in that list.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtrial.instrumentation.proxy.commands import proxy_command
from flowtrial.study.errors import FlowtrialError

if TYPE_CHECKING:
    from flowtrial.instrumentation.proxy.extensions import ProxyExtension
    from flowtrial.instrumentation.proxy.server import ProxyHandle
    from flowtrial.study.config import StudyConfig

__all__ = ["main", "proxy", "serve_proxy", "standard_extensions"]


def standard_extensions() -> list[ProxyExtension]:
    """What the proxy serves besides the model protocols: the set flowtrial ships (the event
    API, Continue's data destination, the participant page, the admin endpoints, the OpenAPI
    document and, with the ``[telemetry]`` extra, agents' OpenTelemetry). A deployment that
    wants more or fewer changes this list."""
    from flowtrial.instrumentation.proxy.extensions import builtin_extensions

    return builtin_extensions()


#: ``flowtrial proxy``.
proxy = proxy_command(standard_extensions)


@contextlib.contextmanager
def serve_proxy(db: str | Path, config: StudyConfig, **kwargs: Any) -> Iterator[ProxyHandle]:
    """:func:`~flowtrial.instrumentation.proxy.server.serve_proxy` with the standard
    extensions."""
    from flowtrial.instrumentation.proxy.server import serve_proxy as serve

    with serve(db, config, extensions=standard_extensions(), **kwargs) as handle:
        yield handle


def main() -> None:
    """``python -m flowtrial.proxy_assembly --study study.toml --db study.db``."""
    import typer

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(proxy)
    try:
        app(standalone_mode=False)
    except FlowtrialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors
        from flowtrial.cli import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
