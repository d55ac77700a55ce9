"""`flowtrial export`: every table to CSV or Parquet, optionally de-identified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import pandas as pd

from study.schema import TABLES
from study.storage import Database

# Columns that hold what people wrote or read, and secrets: never in a de-identified export.
CONTENT_COLUMNS = {"prompt_text", "content_text", "prompt_fingerprint", "content_fingerprint",
                   "error", "config_toml", "description"}
SECRET_COLUMNS = {"key_hash", "key_salt", "key_id"}
ID_COLUMNS = {"participant_id", "checked_against"}
TITLE_KEYS = {"title", "url", "file", "project", "text", "accepted_text", "completion"}


def _pseudo(value: object, salt: str) -> object:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return value
    return "h_" + hashlib.sha256(f"{salt}:{value}".encode()).hexdigest()[:12]


def _deidentify_payload(raw: object, salt: str) -> object:
    if not isinstance(raw, str) or not raw:
        return raw
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if isinstance(data, dict):
        for k in list(data):
            if k in TITLE_KEYS:
                data[k] = _pseudo(data[k], salt)
    return json.dumps(data, sort_keys=True)


def export_tables(
    database: Database,
    out_dir: Path,
    fmt: Literal["csv", "parquet"] = "csv",
    deidentify: bool = False,
) -> dict[str, int]:
    """Write one file per table; returns rows written per table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    st = database.study()
    salt = f"{st.name}:{st.created_at.isoformat()}" if st else "flowtrial"
    counts: dict[str, int] = {}
    for model in TABLES:
        table = model.__table__  # type: ignore[attr-defined]
        df = pd.read_sql_table(table.name, database.engine)
        df = df.drop(columns=[c for c in SECRET_COLUMNS if c in df.columns])
        if deidentify:
            df = df.drop(columns=[c for c in CONTENT_COLUMNS if c in df.columns])
            for c in ID_COLUMNS & set(df.columns):
                df[c] = df[c].map(lambda v: _pseudo(v, salt))
            if table.name == "participants":
                df["id"] = df["id"].map(lambda v: _pseudo(v, salt))
                df = df.drop(columns=["working_apps_json"], errors="ignore")
            if "payload_json" in df.columns:
                df["payload_json"] = df["payload_json"].map(lambda v: _deidentify_payload(v, salt))
        path = out_dir / f"{table.name}.{fmt}"
        if fmt == "csv":
            df.to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False)
        counts[table.name] = len(df)
    return counts
