"""``python -m instrumentation.proxy --study study.toml --db study.db``: the proxy command
without the ``flowtrial`` CLI (used by the kill -9 test and for debugging)."""

from __future__ import annotations

import sys

import typer
import typer.core

from flowtrial.study.errors import FlowtrialError

from .commands import proxy


def main() -> None:
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
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
