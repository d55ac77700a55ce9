"""Every `flowtrial` command has --help text and a README section (fails when one lacks either)."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from flowtrial.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def command_names() -> list[str]:
    group = typer.main.get_command(app)
    return sorted(group.commands)  # type: ignore[attr-defined]


def test_every_command_has_help_text() -> None:
    runner = CliRunner()
    for name in command_names():
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
        assert cmd.help and len(cmd.help.strip()) > 20, f"`flowtrial {name}` has no help text"


def test_every_command_has_a_readme_section() -> None:
    text = README.read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,4} `flowtrial ([a-z-]+)", text, flags=re.M))
    missing = [n for n in command_names() if n not in headings]
    assert not missing, f"README lacks a '### `flowtrial NAME`' section for: {missing}"


def test_readme_starts_with_the_two_commands() -> None:
    lines = [ln for ln in README.read_text(encoding="utf-8").splitlines() if ln.strip()]
    head = "\n".join(lines[:12])
    assert "flowtrial demo" in head
    assert ".ci/run" in head or "pytest" in head
