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


def test_a_port_in_use_is_one_line_before_any_url(small_study: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = CliRunner().invoke(cli(), ["--db", str(small_study), "--port", str(port)])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"--port {port}" in lines[0] and "http://" not in lines[0]


@pytest.mark.parametrize("host", ["127.0.0.1"])
def test_server_command_is_headless_and_private(host: str) -> None:
    argv, env = streamlit_command("sqlite:////x/study.db", 8765, host)
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--client.toolbarMode") + 1] == "viewer"  # no Deploy button
    assert argv[argv.index("--server.address") + 1] == host
    assert env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
    # The URL (a PostgreSQL one carries its password) goes by environment, not argv (ps).
    assert not any("study.db" in a for a in argv)
    assert env["FLOWTRIAL_DASHBOARD_DB"] == "sqlite:////x/study.db"
    assert set(env["FLOWTRIAL_DASHBOARD_HOSTS"].split(",")) >= {"localhost", "127.0.0.1"}


def test_listening_beyond_loopback_needs_a_password(small_study: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWTRIAL_DASHBOARD_PASSWORD", raising=False)
    res = CliRunner().invoke(cli(), ["--db", str(small_study), "--host", "0.0.0.0"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "FLOWTRIAL_DASHBOARD_PASSWORD" in lines[0]


def test_host_allow_list() -> None:
    from flowtrial.dashboards.access import allowed_hosts, host_allowed, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    local = allowed_hosts("127.0.0.1")
    assert host_allowed({"host": "localhost:8501"}, local)
    assert host_allowed({"Host": "[::1]:8501"}, local)
    # DNS rebinding: a page of another site whose name now points at 127.0.0.1.
    assert not host_allowed({"host": "evil.example:8501"}, local)
    assert not host_allowed({"user-agent": "x"}, local)  # a browser always sends Host
    lan = allowed_hosts("10.1.2.3", ["dash.lab.example"])
    assert host_allowed({"host": "10.1.2.3:8501"}, lan)
    assert host_allowed({"host": "dash.lab.example"}, lan)
    assert not host_allowed({"host": "evil.example"}, lan)


def test_password_gate_before_any_page(small_study: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboards.conftest import APP

    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_DB", str(small_study))
    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_PASSWORD", "correct horse")
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.metric and len(at.text_input) == 1  # nothing of the study shown
    at.text_input[0].input("wrong")  # a form: typed and submitted in one go
    at.button[0].click().run()
    assert at.error and not at.metric
    at.text_input[0].input("correct horse")
    at.button[0].click().run()
    assert not at.exception and at.metric  # the overview page, with its numbers


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_dashboard_stops_when_the_command_is_terminated(small_study: Path, tmp_path: Path,
                                                        signame: str) -> None:
    """SIGTERM or Ctrl-C (SIGINT) to `flowtrial dashboard` stops its Streamlit child: no
    process left behind, and the port is free after."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "flowtrial.cli", "dashboard", "--db",
                             str(small_study), "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "did not start"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        children = [int(c) for t in Path(f"/proc/{proc.pid}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        assert children, "streamlit runs as a child of the command"
        proc.send_signal(getattr(signal, signame))
        proc.wait(30)
        for child in children:
            with pytest.raises(ProcessLookupError):
                os.kill(child, 0)  # gone (and reaped), not orphaned
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_wrong_passwords_limited_per_address_across_sessions(
        small_study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel sessions from one address share its budget of wrong passwords (5 a minute):
    a new session after that is told to wait, even with the right password."""
    from streamlit.testing.v1 import AppTest

    from flowtrial.dashboards import access
    from tests.dashboards.conftest import APP

    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_DB", str(small_study))
    monkeypatch.setenv("FLOWTRIAL_DASHBOARD_PASSWORD", "correct horse")
    throttle = access.login_throttle()
    throttle._failures.clear()  # other tests' wrong passwords (same process, same address)
    try:
        for i in range(5):  # five sessions, one guess each
            at = AppTest.from_file(str(APP), default_timeout=120).run()
            at.text_input[0].input(f"guess {i}")
            at.button[0].click().run()
            assert any("Wrong password" in e.value for e in at.error)
        at = AppTest.from_file(str(APP), default_timeout=120).run()
        at.text_input[0].input("correct horse")
        at.button[0].click().run()
        errors = [e.value for e in at.error]
        assert any("Too many wrong passwords" in e for e in errors), errors
        assert not at.metric
    finally:
        throttle._failures.clear()


def test_login_throttle_window() -> None:
    from flowtrial.dashboards.access import LoginThrottle

    now = [0.0]
    t = LoginThrottle(per_minute=2, clock=lambda: now[0])
    t.failed("a")
    t.failed("a")
    assert t.wait_s("a") == 60.0 and t.wait_s("b") == 0.0
    now[0] = 61.0
    assert t.wait_s("a") == 0.0
