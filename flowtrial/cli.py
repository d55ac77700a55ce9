"""The `flowtrial` command line: a thin layer over the packages, loaded lazily.

Each command lives with its package (``<package>/commands.py`` or similar) and is imported
only when it runs or its own ``--help`` is asked for; the listing of ``flowtrial --help``
comes from :data:`COMMANDS`, so it imports no command module at all (pandas, SQLAlchemy and
Starlette stay unloaded; ``tests/root/test_cli_startup.py`` checks it).

Every command reports bad input as one line per problem on stderr and exits with code 2,
having written nothing.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from .study.errors import FlowtrialError

try:  # typer >= 0.25 carries its own copy of click and does not install click itself: its
    # classes are the ones typer builds, its exceptions the ones raised
    from typer import _click as click
except ImportError:  # pragma: no cover - older typer runs on click itself
    import click  # type: ignore[no-redef]

NoArgsIsHelpError = click.exceptions.NoArgsIsHelpError
UsageError = click.exceptions.UsageError


@dataclass(frozen=True)
class CommandSpec:
    """Where a command lives and what the listing says of it (the first paragraph of its
    docstring; a test keeps the two equal)."""

    target: str  # "module:function"
    summary: str
    panel: str
    #: The extras (flowtrial.study.extras) the command cannot run without; checked before it
    #: runs (not for --help), so a missing one is one line naming it.
    needs: tuple[str, ...] = ()


_STUDY, _RUN, _ANALYSE, _CAPTURE = "Set up a study", "Run it", "Analyse", "Capture"

#: Every command, in the order ``flowtrial --help`` lists them.
COMMANDS: dict[str, CommandSpec] = {
    "demo": CommandSpec(
        "flowtrial.simulate_commands:demo",
        "Run a whole latency trial offline in 2–5 minutes: proxy, simulated participants, "
        "analysis, report.",
        _STUDY, needs=("demo",)),
    "init": CommandSpec(
        "flowtrial.study.commands:init",
        "Write a commented example study file to edit.",
        _STUDY),
    "validate": CommandSpec(
        "flowtrial.study.commands:validate",
        "Check a study file without touching any database: one line per problem (exit code "
        "2), or a short summary of the design when it is valid.",
        _STUDY),
    "enroll": CommandSpec(
        "flowtrial.study.commands:enroll",
        "Enroll a participant: assigns arms and prints their API key once (only a hash is "
        "kept).",
        _STUDY),
    "withdraw": CommandSpec(
        "flowtrial.study.commands:withdraw",
        "Withdraw a participant: the proxy stops recording them at once (within a second); "
        "with --delete every row of theirs is deleted, leaving one audit line with row "
        "counts.",
        _STUDY),
    "onboard": CommandSpec(
        "flowtrial.instrumentation.field_commands:onboard",
        "Print a participant's ready-to-paste settings for one assistant (the same the "
        "participant page shows), with their key filled in when it is in $FLOWTRIAL_KEY.",
        _STUDY),
    "status": CommandSpec(
        "flowtrial.study.commands:status",
        "Show enrollment, assignments and cycles per arm, and the sample-ratio-mismatch "
        "check.",
        _STUDY),
    "team-token": CommandSpec(
        "flowtrial.study.commands:team_token",
        "Issue the team token of an observe study (printed once; the previous one stops "
        "working): every team member's agent sends its telemetry with it, and each person is "
        "stored under a salted pseudonym of their identity.",
        _STUDY),
    "migrate": CommandSpec(
        "flowtrial.study.commands:migrate",
        "Upgrade a study database made by an older flowtrial to this version's schema "
        "(opening it does this too; run it once before starting several proxies on one "
        "database).",
        _STUDY),
    "proxy": CommandSpec(
        "flowtrial.proxy_assembly:proxy",
        "Run the latency-shaping proxy: point participants' assistants at the URL it prints.",
        _RUN, needs=("proxy",)),
    "mock-model": CommandSpec(
        "flowtrial.instrumentation.mock_model.commands:mock_model",
        "Serve the built-in simulated model: OpenAI (chat, completions, responses incl. "
        "WebSocket mode) and Anthropic Messages wire formats, offline, with no API key.",
        _RUN, needs=("proxy",)),
    "simulate": CommandSpec(
        "flowtrial.simulate_commands:simulate",
        "Add simulated participants with known ground truth to a study database.",
        _RUN),
    "import-activitywatch": CommandSpec(
        "flowtrial.instrumentation.capture_commands:import_activitywatch",
        "Import a participant's ActivityWatch window, AFK, editor and browser data as focus "
        "events (idempotent: importing the same data twice adds nothing).",
        _CAPTURE),
    "sync-activitywatch": CommandSpec(
        "flowtrial.instrumentation.field_commands:sync_activitywatch",
        "Send your ActivityWatch data to the study: only what its capture policy allows, "
        "filtered on this machine (no window titles or web addresses unless the study keeps "
        "content).",
        _CAPTURE),
    "import-otel": CommandSpec(
        "flowtrial.instrumentation.capture_commands:import_otel",
        "Import a coding agent's OpenTelemetry (Claude Code, Codex CLI, Gemini CLI) from an "
        "OTLP JSON file or Gemini CLI's outfile as events linked to the participant's cycles "
        "(idempotent: importing the same records twice adds nothing).",
        _CAPTURE, needs=("telemetry",)),
    "codex-notify": CommandSpec(
        "flowtrial.instrumentation.capture_commands:codex_notify",
        "Send Codex CLI's end-of-turn notification to the proxy as agent telemetry (set it as "
        "Codex's notify program: docs/clients/telemetry.md).",
        _CAPTURE),
    "persistence": CommandSpec(
        "flowtrial.instrumentation.capture_commands:persistence",
        "Check whether each completion's text persists in the participant's later prompts at "
        "the study's persistence intervals (passive acceptance); adds only rows not yet "
        "decided.",
        _CAPTURE),
    "analyze": CommandSpec(
        "flowtrial.analysis.report_commands:analyze",
        "Run the preregistered analysis: checks, task-time effect, flow threshold, secondary "
        "outcomes; write results.json and a self-contained report.html.",
        _ANALYSE, needs=("analysis",)),
    "turns": CommandSpec(
        "flowtrial.study.commands:turns",
        "Rebuild the agent turns from the recorded cycles (older or imported data gets "
        "turns: kinds are inferred where the proxy recorded none).",
        _ANALYSE),
    "effect": CommandSpec(
        "flowtrial.analysis.commands:effect",
        "Estimate the task-time effect (METR-style): OLS of log time on arm + log forecast.",
        _ANALYSE, needs=("analysis",)),
    "threshold": CommandSpec(
        "flowtrial.analysis.commands:threshold",
        "Estimate the flow threshold: the median personal threshold and the spread τ between "
        "people (random-breakpoint hinge logistic of P(switch) on log wait), the existence "
        "test, and the pooled onset ψ* as a secondary figure (docs/concepts/analysis.md).",
        _ANALYSE),
    "power": CommandSpec(
        "flowtrial.analysis.report_commands:power",
        "Power analysis by simulation: power to detect the flow threshold, CI coverage of the "
        "true ψ and power of the task-time effect, per participants × prompts cell.",
        _ANALYSE, needs=("analysis",)),
    "notebooks": CommandSpec(
        "flowtrial.analysis.commands:notebooks",
        "Open the analysis notebooks (task effects, flow threshold, power) in JupyterLab on a "
        "study database.",
        _ANALYSE, needs=("notebooks",)),
    "dashboard": CommandSpec(
        "flowtrial.dashboards.commands:dashboard",
        "Open the study dashboard (Streamlit): overview, flow timeline, arms, flow threshold "
        "and team view, read live from the study database.",
        _ANALYSE, needs=("dashboard",)),
    "export": CommandSpec(
        "flowtrial.analysis.release_commands:export",
        "Export every table as CSV or Parquet (keys and their hashes are never exported), or "
        "with --release a de-identified data package of the analysis tables with its "
        "codebook.",
        _ANALYSE),
}

err_console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print a one-line problem to stderr and return the exit to raise (code 2)."""
    for line in message.splitlines():
        # escape: a message may quote a table name such as [per_prompt], not markup
        err_console.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """The one-line advice for a missing optional dependency, or None if it is not one."""
    from .study.extras import extra_of_module, install_hint

    top = (exc.name or "").split(".")[0]
    extra = extra_of_module(exc.name or "")
    if extra is None:
        return None
    return (f"this command needs {top}, which comes with the [{extra}] extra: "
            f"{install_hint(extra)}")


def usage_error(exc: UsageError) -> typer.Exit:
    """A usage error (missing or bad option, unknown command) as one line, exit code 2.

    Typer would print click's usage block and a boxed message; the one line names the
    problem and where the help is.
    """
    message = exc.format_message().strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    path = exc.ctx.command_path if exc.ctx is not None else "flowtrial"
    return fail(f"{path}: {message} (see `{path} --help`)")


def _hide_flag_types(params: list[click.Parameter]) -> list[click.Parameter]:
    """Typer's rich help shows an option's type next to it (``--db <str>``), flags included
    (``--json <bool>``, ``--help <bool>``), although a flag takes no value: its plain help
    leaves flags out, its rich help does not. An empty metavar shows nothing for them."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def _parse_args(parse: object, ctx: click.Context, args: list[str]) -> list[str]:
    """Parse, making sure a usage error knows its command (the option parser's do not)."""
    try:
        return parse(ctx, args)  # type: ignore[operator]
    except UsageError as exc:
        if exc.ctx is None:
            exc.ctx = ctx
        raise


class Command(TyperCommand):
    """A typer command whose help shows no type for flags and whose usage errors name it."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _hide_flag_types(super().get_params(ctx))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args(super().parse_args, ctx, args)


def load_command(name: str) -> click.Command:
    """Import the command's module and build its click command (with typer, as usual)."""
    module_name, attr = COMMANDS[name].target.split(":")
    function = getattr(importlib.import_module(module_name), attr)
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(name, cls=Command)(function)
    command = typer.main.get_command(single)
    if COMMANDS[name].needs and command.callback is not None:
        command.callback = _checking_extras(name, command.callback)
    return command


def _checking_extras(name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` that first makes sure the command's extras are installed (after parsing,
    so ``--help`` works without them)."""
    from .study.extras import require

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for extra in COMMANDS[name].needs:
            require(extra, f"flowtrial {name}")
        return callback(*args, **kwargs)

    return checked


class LazyGroup(TyperGroup):
    """A typer group whose commands load on demand (click's documented lazy-group pattern).

    Listing the commands for ``--help`` uses the summaries in :data:`COMMANDS`; running a
    command or asking for its help imports it. User errors anywhere below become one-line
    messages with exit code 2.
    """

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        if self._listing:
            return TyperCommand(cmd_name, help=spec.summary or None,
                                rich_help_panel=spec.panel)
        return load_command(cmd_name)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _hide_flag_types(super().get_params(ctx))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_args(super().parse_args, ctx, args)

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: object) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            raise usage_error(exc) from None

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except FlowtrialError as exc:
            raise fail(str(exc)) from None
        except UsageError as exc:
            raise usage_error(exc) from None
        except ModuleNotFoundError as exc:
            advice = missing_extra_message(exc)
            if advice is None:
                raise
            raise fail(advice) from None


app = typer.Typer(
    cls=LazyGroup,
    name="flowtrial",
    help="Latency-controlled trials of AI coding assistants.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Latency-controlled trials of AI coding assistants."""


def main() -> None:
    """Console-script entry point (also ``python -m flowtrial``)."""
    app(prog_name="flowtrial")


if __name__ == "__main__":
    main()
