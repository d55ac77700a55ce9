"""``flowtrial export --deidentify``: no content, no titles, no raw identifiers — in every
table and in both formats — while pseudonyms still join across the tables of one export."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from flowtrial.cli import app as cli
from flowtrial.instrumentation.continue_data import CONTINUE_PATH
from flowtrial.study.export import (
    CONTENT_COLUMNS,
    DROP_COLUMNS,
    NOT_EXPORTED,
    SECRET_COLUMNS,
    export_tables,
)
from flowtrial.study.schema import TABLES, Event, GroundTruth, Persistence, QuestionnaireAnswer
from flowtrial.study.storage import WriteBatch, utcnow, write_rows
from flowtrial.study.tasks import add_task
from tests.security.conftest import Study, bearer, make_study, proxy_client

PIDS = ("alice-smith-1987", "bob.jones")
MODEL = "flowtrial-sim-1"
SECRETS_IN_CONTENT = [
    "PROMPT-SECRET-ALPHA", "TITLE-SECRET standup", "intranet.example/secret",
    "/home/alice/secret_plans.py", "PROJECT-SECRET", "NOTE-SECRET", "NESTED-SECRET",
    "TASKNAME-SECRET Acme billing", "DESC-SECRET", "alices-laptop", "ACCEPTED-TEXT-SECRET",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    s = make_study(tmp_path_factory.mktemp("deid"), {"capture": {"content": "full"}},
                   participants=PIDS)
    alice, bob = (s.keys[p] for p in PIDS)
    with proxy_client(s) as c:
        chat = {"model": MODEL, "max_tokens": 24,
                "messages": [{"role": "user", "content": "PROMPT-SECRET-ALPHA: write a sort"}]}
        cid = c.post("/v1/chat/completions", json=chat,
                     headers=bearer(alice)).headers["x-flowtrial-cycle-id"]
        cid2 = c.post("/v1/responses", json={"model": MODEL, "input": "PROMPT-SECRET-ALPHA",
                                             "max_output_tokens": 16},
                      headers=bearer(bob)).headers["x-flowtrial-cycle-id"]
        c.post("/v1/chat/completions", json={"messages": []}, headers=bearer(alice))  # error
        with c.websocket_connect("/v1/responses", headers=bearer(alice)) as ws:
            ws.send_text(json.dumps({"type": "response.create", "model": MODEL,
                                     "input": "PROMPT-SECRET-ALPHA", "max_output_tokens": 8}))
            while json.loads(ws.receive_text())["type"] not in ("response.completed",
                                                                "response.incomplete"):
                pass
        r = c.post("/flowtrial/v1/events", headers=bearer(alice), json={"events": [
            {"kind": "focus_out", "cycle_id": cid, "duration_s": 12.0, "payload": {
                "app": "Slack", "category": "chat", "title": "TITLE-SECRET standup",
                "url": "https://intranet.example/secret", "file": "/home/alice/secret_plans.py",
                "project": "PROJECT-SECRET"}},
            {"kind": "partial_accept", "cycle_id": cid, "payload": {
                "accepted_chars": 12, "accepted_text": "ACCEPTED-TEXT-SECRET"}},
            {"kind": "custom", "payload": {"note": "NOTE-SECRET", "count": 3,
                                           "nested": {"text": "NESTED-SECRET"},
                                           "NOTE-SECRET as a key": 1}},
        ]})
        assert r.status_code == 200, r.text
        r = c.post(CONTINUE_PATH, headers=bearer(alice), json={
            "name": "autocomplete", "data": {"accepted": True, "completionId": cid}})
        assert r.json()["cycle_id"] == cid
    task = add_task(s.database, PIDS[0], "TASKNAME-SECRET Acme billing",
                    description="DESC-SECRET")
    now = utcnow()
    write_rows(s.database, [
        WriteBatch(Event, [{
            "participant_id": PIDS[0], "cycle_id": None, "kind": "focus_out",
            "ts_ns": 1_795_000_000_000_000_000, "duration_s": 30.0, "source": "activitywatch",
            "payload_json": json.dumps({"app": "firefox", "title": "TITLE-SECRET standup"}),
            "dedupe_key": f"aw:{PIDS[0]}:aw-watcher-window_alices-laptop:1", "received_at": now}]),
        WriteBatch(QuestionnaireAnswer, [{"participant_id": PIDS[0], "task_id": task,
                                          "instrument": "nasa_tlx", "item": "effort",
                                          "value": 4.0, "answered_at": now}]),
        WriteBatch(Persistence, [{"cycle_id": cid, "interval_s": 30.0, "score": 0.9,
                                  "persisted": True, "checked_against": cid2}]),
        WriteBatch(GroundTruth, [{"scope": "participant", "participant_id": PIDS[1],
                                  "truth_model": "hinge", "params_json": "{\"psi\": 8}"}]),
    ])
    yield s
    s.database.dispose()


def raw_identifiers(s: Study) -> list[str]:
    """Every raw identifier in the database that a de-identified export must not show."""
    ids = list(PIDS)
    for col in ("id", "connection_id", "upstream_response_id", "recorded_by"):
        ids += [r[0] for r in s.rows(f"SELECT DISTINCT {col} FROM cycles") if r[0]]
    ids += [r[0] for r in s.rows("SELECT dedupe_key FROM events") if r[0]]
    ids += [r[0] for r in s.rows("SELECT name FROM tasks")]
    ids += [v for r in s.rows("SELECT key_id, key_salt, key_hash FROM participants") for v in r]
    return ids


def content(s: Study) -> list[str]:
    texts = list(SECRETS_IN_CONTENT)
    for col in ("prompt_text", "content_text", "content_fingerprint", "prompt_fingerprint"):
        texts += [r[0][:60] for r in s.rows(f"SELECT {col} FROM cycles") if r[0]
                  and len(r[0]) >= 20]
    return texts


def read(out: Path, fmt: str) -> dict[str, pd.DataFrame]:
    tables = {}
    for model in TABLES:
        name = model.__table__.name  # type: ignore[attr-defined]
        if name in NOT_EXPORTED:  # the audit of withdrawals stays in the database
            assert not (out / f"{name}.{fmt}").exists()
            continue
        p = out / f"{name}.{fmt}"
        tables[name] = pd.read_csv(p) if fmt == "csv" else pd.read_parquet(p)
    return tables


def text_of(out: Path, fmt: str) -> str:
    """All of an export as text: the raw files, and for Parquet the decoded tables."""
    parts = []
    for p in sorted(out.iterdir()):
        parts.append(p.read_bytes().decode("latin-1"))
        if fmt == "parquet":
            parts.append(pd.read_parquet(p).to_csv(index=False))
    return "\n".join(parts)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_deidentified_export_has_no_content_titles_or_raw_ids(study: Study, tmp_path: Path,
                                                              fmt: str) -> None:
    out = tmp_path / "deid"
    r = CliRunner().invoke(cli, ["export", "--db", str(study.db), "--out", str(out),
                                 "--format", fmt, "--deidentify"])
    assert r.exit_code == 0, r.output
    blob = text_of(out, fmt)
    for needle in raw_identifiers(study) + content(study):
        assert needle not in blob, f"{needle!r} is in the de-identified {fmt} export"
    tables = read(out, fmt)
    forbidden = CONTENT_COLUMNS | SECRET_COLUMNS | DROP_COLUMNS
    for name, df in tables.items():
        assert not forbidden & set(df.columns), (name, forbidden & set(df.columns))
    # Nothing lost that is not identifying: every table has all its rows.
    for name, df in tables.items():
        assert len(df) == study.count(name) if name in ("cycles", "events", "tasks") else True
    # Pseudonyms join across tables.
    cyc, ev, parts = tables["cycles"], tables["events"], tables["participants"]
    pseudo_ids = set(parts["id"])
    assert all(str(p).startswith("h_") for p in pseudo_ids) and len(pseudo_ids) == 2
    for name in ("cycles", "events", "tasks", "assignments", "questionnaire_answers"):
        assert set(tables[name]["participant_id"]) <= pseudo_ids, name
    assert set(tables["ground_truth"]["participant_id"].dropna()) <= pseudo_ids
    cycle_ids = set(cyc["id"])
    assert set(ev["cycle_id"].dropna()) <= cycle_ids and ev["cycle_id"].notna().sum() >= 3
    per = tables["persistence"]
    assert set(per["cycle_id"]) <= cycle_ids and set(per["checked_against"]) <= cycle_ids
    ws = cyc[cyc["transport"] == "websocket"]
    assert len(ws) == 1 and str(ws["connection_id"].iloc[0]).startswith("h_")
    # Event payloads keep what analysis needs (app, category, counts) and nothing else.
    payloads = [json.loads(p) for p in ev["payload_json"].dropna()]
    assert {"app": "Slack", "category": "chat"} in payloads
    assert {"accepted_chars": 12} in payloads and {"count": 3} in payloads
    assert {"app": "firefox"} in payloads
    linked = next(p for p in payloads if "completion_id" in p)
    assert linked["completion_id"] in cycle_ids  # Continue's id = the cycle's, pseudonymized


def test_pseudonyms_are_keyed_per_export(study: Study, tmp_path: Path) -> None:
    """Two exports pseudonymize differently (the key is random and never stored), so nobody
    can recompute a pseudonym from a guessed id; a given key reproduces them."""
    a = export_tables(study.database, tmp_path / "a", deidentify=True)
    export_tables(study.database, tmp_path / "b", deidentify=True)
    export_tables(study.database, tmp_path / "c", deidentify=True, salt=b"k" * 32)
    export_tables(study.database, tmp_path / "d", deidentify=True, salt=b"k" * 32)
    ids = {k: set(pd.read_csv(tmp_path / k / "participants.csv")["id"]) for k in "abcd"}
    assert ids["a"].isdisjoint(ids["b"]) and ids["c"] == ids["d"]
    assert a["cycles"] == study.count("cycles")
    db_blob = "\n".join(map(str, study.rows("SELECT * FROM meta")))
    db_blob += "\n".join(map(str, study.rows("SELECT * FROM studies")))
    for p in ids["a"] | ids["b"]:
        assert p not in db_blob


def test_plain_export_keeps_everything_but_keys(study: Study, tmp_path: Path) -> None:
    """The control: without --deidentify the same needles are there (so the search above
    can find them), and key material is not."""
    out = tmp_path / "plain"
    export_tables(study.database, out, "csv")
    blob = text_of(out, "csv")
    for needle in ("PROMPT-SECRET-ALPHA", "TITLE-SECRET standup", "NOTE-SECRET",
                   "TASKNAME-SECRET Acme billing", *PIDS):
        assert needle in blob
    for key in study.keys.values():
        assert key.split("_", 2)[2] not in blob
    for v in [v for r in study.rows("SELECT key_salt, key_hash FROM participants") for v in r]:
        assert v not in blob
