"""The documentation: every `flowtrial` command has --help text and a section in the CLI
reference, the reference is what `--help` prints today (generated with cog), every pointer
to a docs page from the code names a page that exists, and the README starts with the two
commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_REFERENCE = DOCS / "reference" / "cli.md"
CODE_DIRS = ("flowtrial", "study", "instrumentation", "analysis", "dashboards", "benchmarks",
             "tests")


def command_names() -> list[str]:
    group = typer.main.get_command(app)
    return sorted(group.list_commands(None))  # type: ignore[arg-type]


def test_every_command_has_help_text() -> None:
    runner = CliRunner()
    for name in command_names():
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        cmd = typer.main.get_command(app).get_command(None, name)  # type: ignore[attr-defined]
        assert cmd.help and len(cmd.help.strip()) > 20, f"`flowtrial {name}` has no help text"


def test_every_command_has_a_section_in_the_cli_reference() -> None:
    text = CLI_REFERENCE.read_text(encoding="utf-8")
    headings = set(re.findall(r"^## `flowtrial ([a-z-]+)`", text, flags=re.M))
    missing = [n for n in command_names() if n not in headings]
    assert not missing, (f"docs/reference/cli.md lacks a section for {missing}: "
                         "run `cog -r docs/reference/cli.md`")
    assert sorted(headings) == sorted(COMMANDS), "the reference lists a command that is gone"


def test_the_cli_reference_is_what_help_prints_today() -> None:
    """cog --check fails when a command's --help changed and the page was not regenerated."""
    pytest.importorskip("cogapp", reason="cogapp comes with the [docs] and [test] extras")
    proc = subprocess.run([sys.executable, "-m", "cogapp", "--check", "--diff",
                           str(CLI_REFERENCE)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (
        "docs/reference/cli.md is stale: run `cog -r docs/reference/cli.md`\n"
        + proc.stdout + proc.stderr)
    text = CLI_REFERENCE.read_text(encoding="utf-8")
    assert "Usage: flowtrial validate [OPTIONS]" in text and "<bool>" not in text


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text)


def test_every_docs_pointer_in_the_code_names_a_page_and_anchor_that_exist() -> None:
    pointers: set[tuple[Path, str, str]] = set()
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for page, anchor in re.findall(r"\bdocs/([\w/.-]+\.md)(?:#([\w-]+))?", text):
                pointers.add((path.relative_to(ROOT), page, anchor))
    assert len(pointers) >= 20, "the code's definitions point at the docs"
    bad = []
    for source, page, anchor in sorted(pointers):
        target = DOCS / page
        if not target.is_file():
            bad.append(f"{source}: docs/{page} does not exist")
            continue
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", target.read_text(encoding="utf-8"), re.M)
            if anchor not in {_slug(h) for h in headings}:
                bad.append(f"{source}: docs/{page} has no heading #{anchor}")
    assert not bad, "\n".join(bad)


def test_no_code_cites_the_design_document() -> None:
    """The design reference moved into docs/concepts/; citations of its sections point
    nowhere a reader of the repository can follow."""
    cites = [f"{path.relative_to(ROOT)}:{n}"
             for top in CODE_DIRS for path in (ROOT / top).rglob("*.py")
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search("DESIGN" + r"(\.md)?\s*§", line)]
    assert not cites, cites


def test_readme_starts_with_the_two_commands() -> None:
    """A newcomer's first two commands: install and run the demo (SQLite, the built-in
    simulated model, no key, no network), and run the whole suite as CI does."""
    lines = [ln for ln in README.read_text(encoding="utf-8").splitlines() if ln.strip()]
    head = "\n".join(lines[:12])
    assert "pip install -e '.[demo]' && flowtrial demo" in head
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/run" in head and "pytest" in ci


def test_readme_is_short_and_links_to_the_docs() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), page
    assert "docs/" in text
