"""End to end: the real `streamlit run` server on a free loopback port, every page loaded in
headless Chromium; fails on any Streamlit exception or error alert, keeps a screenshot per
page in test-artifacts/ (git-ignored)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from flowtrial.dashboards.commands import streamlit_command

CHROMIUM = "/usr/bin/chromium"
PAGE_BUDGET_MS = 180_000
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PAGES = {"overview": ("", "Study overview"), "timeline": ("timeline", "Flow timeline"),
         "arms": ("arms", "Arms"), "threshold": ("threshold", "Flow threshold"),
         "team": ("team", "Team view")}

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("streamlit did not become healthy")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.timeout(1200)  # five pages, each within PAGE_BUDGET_MS
def test_every_page_loads_in_chromium(small_study: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    argv, env = streamlit_command(str(small_study), port, "127.0.0.1")
    log = ARTIFACTS / "streamlit-server.log"
    ARTIFACTS.mkdir(exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=ARTIFACTS)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # Budgets that fit a loaded 2-core CI machine: the threshold page's bootstrap took
            # over 60 s there while other test processes ran.
            for name, (path, title) in PAGES.items():
                page.goto(f"{base}/{path}", wait_until="domcontentloaded")
                page.get_by_role("heading", name=title).first.wait_for(timeout=PAGE_BUDGET_MS)
                # Every page ends with charts that have a CSV download: wait for one, then
                # for the script run to finish (the "Stop" control goes away).
                page.locator('[data-testid="stDownloadButton"]').first.wait_for(
                    timeout=PAGE_BUDGET_MS)
                page.get_by_role("button", name="Stop").wait_for(state="hidden",
                                                                 timeout=PAGE_BUDGET_MS)
                page.wait_for_timeout(500)
                page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)
                exceptions = page.locator('[data-testid="stException"]').count()
                errors = [a.inner_text() for a in page.locator('[data-testid="stAlert"]').all()
                          if a.locator('[data-testid="stAlertContentError"]').count()]
                assert exceptions == 0, f"{name}: Streamlit exception shown"
                assert not errors, f"{name}: error alert {errors}"
                assert page.locator('[data-testid="stDownloadButton"]').count() > 0, name
                # client.toolbarMode = viewer: nothing to publish from a study dashboard.
                assert page.locator('[data-testid="stAppDeployButton"]').count() == 0, name
                assert page.get_by_role("button", name="Deploy").count() == 0, name
            browser.close()
    finally:
        stop(proc)


def test_dns_rebinding_and_password_in_chromium(small_study: Path) -> None:
    """The real server behind a password: Chromium reaching it under another site's name
    (DNS rebinding: evil.example resolving to 127.0.0.1) sees no study data, under its own
    name it sees the password form, and the study only once the password is entered."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    argv, env = streamlit_command(str(small_study), port, "127.0.0.1")
    env["FLOWTRIAL_DASHBOARD_PASSWORD"] = "correct horse"
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / "streamlit-gate.log").open("wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=ARTIFACTS)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--host-resolver-rules=MAP evil.example 127.0.0.1"])
            page = browser.new_page()
            page.goto(f"http://evil.example:{port}/", wait_until="domcontentloaded")
            page.get_by_text("not served under this host name").wait_for(timeout=60_000)
            assert page.get_by_label("Dashboard password").count() == 0
            assert page.get_by_role("heading", name="Study overview").count() == 0

            page.goto(f"http://localhost:{port}/", wait_until="domcontentloaded")
            field = page.get_by_label("Dashboard password")
            field.wait_for(timeout=60_000)
            assert page.get_by_role("heading", name="Study overview").count() == 0
            field.fill("correct horse")
            page.get_by_role("button", name="Open the dashboard").click()
            page.get_by_role("heading", name="Study overview").first.wait_for(timeout=60_000)
            browser.close()
    finally:
        stop(proc)


def page_in_chromium(db: Path, path: str, title: str, shot: str) -> str:
    """One page of the real dashboard server on ``db`` in headless Chromium, once its script
    run has finished: asserts no exception or error alert, keeps ``test-artifacts/<shot>.png``
    and returns the page's text."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip("needs /usr/bin/chromium")
    port = free_port()
    argv, env = streamlit_command(str(db), port, "127.0.0.1")
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / f"{shot}.log").open("wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, cwd=ARTIFACTS)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # The start page first: it runs the access gate and opens the study for the
            # session (a fresh session opened on a page's own URL fails without it).
            page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Study overview").first.wait_for(
                timeout=PAGE_BUDGET_MS)
            page.goto(f"http://127.0.0.1:{port}/{path}", wait_until="domcontentloaded")
            page.get_by_role("heading", name=title).first.wait_for(timeout=PAGE_BUDGET_MS)
            page.locator('[data-testid="stDownloadButton"]').first.wait_for(
                timeout=PAGE_BUDGET_MS)
            page.get_by_role("button", name="Stop").wait_for(state="hidden",
                                                             timeout=PAGE_BUDGET_MS)
            page.wait_for_timeout(1000)  # Vega draws after the script run
            page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)
            assert page.locator('[data-testid="stException"]').count() == 0
            errors = [a.inner_text() for a in page.locator('[data-testid="stAlert"]').all()
                      if a.locator('[data-testid="stAlertContentError"]').count()]
            assert not errors, errors
            assert page.locator("canvas, svg.marks").count() > 0  # charts were drawn
            text = page.locator("body").inner_text()
            browser.close()
            return text
    finally:
        stop(proc)
