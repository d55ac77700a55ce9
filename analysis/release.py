"""``flowtrial export --release DIR``: a Frictionless data package of the tidy analysis tables
(docs/researchers/field-study.md#7-release-the-data).

Writes ``cycles.csv``, ``turns.csv`` and ``tasks.csv`` (one row per cycle, agent turn and
task, real seconds, as the report computes them: :func:`~.metrics.cycle_table_from_frames`,
:func:`~.metrics.task_table_from_frames`, and the proxy's turns), ``datapackage.json`` (each
column's type, unit and definition from :mod:`.codebook`, and the flowtrial version and the
study configuration's SHA-256) and ``README.md``. De-identified: participant, cycle and turn
ids become pseudonyms keyed by a secret drawn for this release and never written; task names
and links (free text, repository addresses) are left out; no content, titles or URLs are in
these tables at all.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.export import neutralize_formulas, pseudonym
from flowtrial.study.provenance import provenance

from .codebook import CODEBOOK, TABLE_TITLES, field_for
from .metrics import cycle_table_from_frames, read_frames, task_table_from_frames

__all__ = ["release_tables", "write_release"]

PSEUDONYMIZED = {"cycle_id", "participant_id", "turn_id"}
LEFT_OUT = {"name", "link"}  # tasks: free text and repository addresses
_MS = {"wait_ms": "wait_s", "model_ms": "model_s", "injected_ms": "injected_s",
       "tool_ms": "tool_s", "gap_ms": "gap_s"}


def _turns(database: Any, scale: float) -> pd.DataFrame:
    with database.engine.connect() as conn:
        t = pd.read_sql("SELECT * FROM turns ORDER BY participant_id, t_start_ns", conn)
    out = pd.DataFrame({c: t[c] for c in ("id", "participant_id", "arm", "period", "task_id",
                                          "protocol", "client")}).rename(
        columns={"id": "turn_id"})
    out["started_at"] = pd.to_datetime(t["started_at"], utc=True)
    for c in ("model_calls", "side_calls", "retries", "tool_calls"):
        out[c] = t[c].astype("Int64")
    for ms, s in _MS.items():
        out[s] = pd.to_numeric(t[ms], errors="coerce") / 1000.0 * scale
    out["status"] = t["status"]
    for c in ("period", "task_id"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("Int64")
    return out


def release_tables(database: Any) -> dict[str, pd.DataFrame]:
    """The three analysis tables as the report computes them (not yet de-identified)."""
    frames = read_frames(database)
    return {"cycles": cycle_table_from_frames(frames),
            "turns": _turns(database, frames.time_scale),
            "tasks": task_table_from_frames(frames)}


def _cell_text(series: pd.Series, type_: str) -> pd.Series:
    """CSV text of a column in the Table Schema's default formats ("" = missing)."""
    if type_ == "datetime":
        s = pd.to_datetime(series, utc=True)
        return s.dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ").where(s.notna(), "")
    if type_ == "boolean":
        return series.map(lambda v: "" if v is None or v is pd.NA or (
            isinstance(v, float) and np.isnan(v)) else ("true" if bool(v) else "false"))
    if type_ == "integer":
        return pd.to_numeric(series, errors="coerce").astype("Int64").astype(str).replace(
            "<NA>", "")
    if type_ == "number":
        return pd.to_numeric(series, errors="coerce").map(
            lambda v: "" if not np.isfinite(v) else repr(float(v)))
    return series.map(lambda v: "" if v is None or v is pd.NA or (
        isinstance(v, float) and np.isnan(v)) else str(v))


def _deidentify(df: pd.DataFrame, key: bytes) -> pd.DataFrame:
    df = df.drop(columns=[c for c in LEFT_OUT if c in df.columns])
    for c in PSEUDONYMIZED & set(df.columns):
        df[c] = df[c].map(lambda v: pseudonym(v, key)).astype(object)
    return df


def _readme(config: Any, prov: dict[str, str], counts: dict[str, int]) -> str:
    rows = "\n".join(f"- `{t}.csv` — {TABLE_TITLES[t]} ({n} rows)" for t, n in counts.items())
    return f"""# {config.study.name}: flowtrial release package

A latency-controlled trial of an AI coding assistant, design **{config.study.design}**
(unit: {config.study.unit}; arms: {', '.join(config.arm_names) or 'per-prompt draws'}).

{rows}

`datapackage.json` is a [Frictionless data package](https://datapackage.org/): every column's
type, unit and definition (the codebook). Durations are real seconds; times are UTC.

De-identified: participant, cycle and turn ids are pseudonyms keyed by a secret drawn for
this release and never written; task names and links are left out; the tables hold no
prompt or answer text, window titles or web addresses.

- flowtrial version: {prov['flowtrial_version']}
- study configuration SHA-256: `{prov['config_hash']}` (the same in the study's
  `results.json` and report)

Validate with `frictionless validate datapackage.json`.
"""


def write_release(database: Any, out_dir: Path, salt: bytes | None = None) -> dict[str, int]:
    """Write the release package into ``out_dir``; rows per table."""
    config = database.config()
    prov = provenance(config)
    key = salt if salt is not None else secrets.token_bytes(32)
    out_dir.mkdir(parents=True, exist_ok=True)
    resources, counts = [], {}
    for table, df in release_tables(database).items():
        df = _deidentify(df, key)
        fields = [field_for(table, c) for c in df.columns]  # every column has an entry
        text = pd.DataFrame({f.name: _cell_text(df[f.name], f.type) for f in fields},
                            index=df.index)
        neutralize_formulas(text).to_csv(out_dir / f"{table}.csv", index=False)
        counts[table] = len(df)
        resources.append({
            "name": table, "path": f"{table}.csv", "title": TABLE_TITLES[table],
            "profile": "tabular-data-resource", "format": "csv", "mediatype": "text/csv",
            "encoding": "utf-8",
            "schema": {"missingValues": [""], "fields": [
                {"name": f.name, "type": f.type, "description": f.definition,
                 **({"unit": f.unit} if f.unit else {})} for f in fields]},
        })
    slug = re.sub(r"[^a-z0-9._-]+", "-", config.study.name.lower()).strip("-") or "study"
    package = {"profile": "tabular-data-package", "name": f"{slug}-release",
               "title": f"{config.study.name}: flowtrial release package",
               "created": datetime.now(UTC).isoformat(timespec="seconds"),
               **prov, "resources": resources}
    (out_dir / "datapackage.json").write_text(json.dumps(package, indent=2) + "\n",
                                              encoding="utf-8")
    (out_dir / "README.md").write_text(_readme(config, prov, counts), encoding="utf-8")
    return counts


assert set(CODEBOOK) == set(TABLE_TITLES)
