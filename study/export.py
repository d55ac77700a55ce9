"""`flowtrial export`: every table to CSV or Parquet, optionally de-identified.

De-identified (``--deidentify``): no content (prompt and answer text and fingerprints, task
descriptions, error texts, the study file as written), no titles, URLs, file or project names
(event payloads keep only an allow-list of fields: app and category names, statuses, counts,
fractions and flags), no raw identifiers: participant ids, cycle ids, connection ids, turn ids
and conversation keys, task names, Continue completion ids and the recording proxy's host are
replaced by pseudonyms
(``h_`` + a keyed hash), the upstream's response ids and the events' dedupe keys (which embed
ids and host names) are dropped. The pseudonyms are keyed by a random secret drawn for each
export and never written anywhere, so they cannot be reversed by hashing candidate ids; the
same id gets the same pseudonym in every table of one export, so joins still work. The model
name a client sent (``cycles.model``, a payload's ``model``) is free text and pseudonymized too.

CSV files never start a text cell with ``=``, ``+``, ``-``, ``@``, tab or CR (a spreadsheet
would run it as a formula): such cells get a leading ``'``. Parquet keeps the values as they are.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from .keys import CONVERSATION_SECRET
from .schema import TABLES
from .storage import Database

# The audit of withdrawals and deletions names withdrawn participants: it stays with the study
# database (the researcher's record that a deletion was carried out), never in an export.
NOT_EXPORTED = {"audit"}
# Columns that hold what people wrote or read, and secrets: never in a de-identified export.
CONTENT_COLUMNS = {"prompt_text", "content_text", "prompt_fingerprint", "content_fingerprint",
                   "error", "config_toml", "description"}
SECRET_COLUMNS = {"key_hash", "key_salt", "key_id"}
# Raw identifiers: pseudonymized (kept joinable) in a de-identified export.
ID_COLUMNS = {"participant_id", "checked_against", "cycle_id", "connection_id", "recorded_by",
              "turn_id", "conversation_key", "first_cycle_id", "last_cycle_id"}
# ``cycles.model`` is whatever the client sent as the model name (free text: it can carry a
# name, a path or a formula): pseudonymized like an id, so cycles still group by model.
ID_COLUMNS_OF = {"participants": {"id"}, "cycles": {"id", "model"}, "tasks": {"name"},
                 "turns": {"id"}}
# Dropped from a de-identified export: ids of other systems, keys that embed ids and hosts.
DROP_COLUMNS = {"upstream_response_id", "dedupe_key", "working_apps_json"}
# Event payload fields kept (as text) in a de-identified export; anything else is dropped,
# except numbers and booleans under plain field names (counts, fractions, flags).
PAYLOAD_TEXT_KEYS = {"app", "category", "status", "page", "continue_event", "link"}
PAYLOAD_ID_KEYS = {"completion_id", "cycle_id", "model"}
# A CSV cell starting with one of these is a formula to a spreadsheet (=HYPERLINK(...) in a
# model or task name would run when the file is opened): such text cells get a leading "'".
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_MAX_TEXT = 200


def _pseudo(value: object, salt: bytes) -> object:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return value
    return "h_" + hmac.new(salt, str(value).encode(), hashlib.sha256).hexdigest()[:16]


def pseudonym(value: object, salt: bytes) -> object:
    """``h_`` + a keyed hash of ``value`` (None and NaN stay as they are)."""
    return _pseudo(value, salt)


def _deidentify_payload(raw: object, salt: bytes) -> object:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    for k, v in data.items():
        if k in PAYLOAD_ID_KEYS and isinstance(v, str | int):
            out[k] = _pseudo(v, salt)
        elif k in PAYLOAD_TEXT_KEYS and isinstance(v, str) and len(v) <= _MAX_TEXT:
            out[k] = v
        elif isinstance(v, bool | int | float) and _PLAIN_KEY.match(k):
            out[k] = v
    return json.dumps(out, sort_keys=True) if out else None


def export_tables(
    database: Database,
    out_dir: Path,
    fmt: Literal["csv", "parquet"] = "csv",
    deidentify: bool = False,
    salt: bytes | None = None,
) -> dict[str, int]:
    """Write one file per table; returns rows written per table.

    ``salt``: the pseudonym key of a de-identified export (default: a fresh random one, so
    pseudonyms differ between exports and cannot be recomputed from the data).
    """
    if fmt == "parquet":
        from .extras import require

        require("parquet", "export --format parquet")
    out_dir.mkdir(parents=True, exist_ok=True)
    key = salt if salt is not None else secrets.token_bytes(32)
    counts: dict[str, int] = {}
    allocated = {a.name for a in database.config().allocated_arms}
    for model in TABLES:
        table = model.__table__  # type: ignore[attr-defined]
        if table.name in NOT_EXPORTED:
            continue
        df = pd.read_sql_table(table.name, database.engine)
        if table.name == "arms":  # a database made before per-prompt studies stored none
            df = df[df["name"].isin(allocated)]
        df = df.drop(columns=[c for c in SECRET_COLUMNS if c in df.columns])
        if table.name == "meta":  # the conversation secret never leaves the database
            df = df[df["key"] != CONVERSATION_SECRET]
        if deidentify:
            df = df.drop(columns=[c for c in CONTENT_COLUMNS | DROP_COLUMNS if c in df.columns])
            for c in (ID_COLUMNS | ID_COLUMNS_OF.get(table.name, set())) & set(df.columns):
                df[c] = df[c].map(lambda v: _pseudo(v, key)).astype(object)
            if "payload_json" in df.columns:
                df["payload_json"] = df["payload_json"].map(
                    lambda v: _deidentify_payload(v, key)).astype(object)
        path = out_dir / f"{table.name}.{fmt}"
        if fmt == "csv":
            neutralize_formulas(df).to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False)
        counts[table.name] = len(df)
    return counts


def _defuse(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def neutralize_formulas(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every text cell a spreadsheet would read as a formula prefixed by ``'``
    (OWASP's CSV injection advice); numbers (a negative one too) are left alone."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object or pd.api.types.is_string_dtype(out[c].dtype):
            out[c] = out[c].map(_defuse)
    return out
