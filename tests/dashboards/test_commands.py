"""`flowtrial dashboard` validation and the server command it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flowtrial.dashboards.commands import dashboard, streamlit_command


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(dashboard)
    return app


def test_missing_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli(), ["--db", str(tmp_path / "nope.db")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no such database" in lines[0]


def test_bad_port_exit_2(small_study: Path) -> None:
    res = CliRunner().invoke(cli(), ["--db", str(small_study), "--port", "0"])
    assert res.exit_code == 2 and "--port" in res.output


@pytest.mark.parametrize("host", ["127.0.0.1"])
def test_server_command_is_headless_and_private(host: str) -> None:
    argv, env = streamlit_command("sqlite:////x/study.db", 8765, host)
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--server.address") + 1] == host
    assert argv[-2:] == ["--db", "sqlite:////x/study.db"]
    assert env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
