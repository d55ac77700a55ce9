"""Writing simulated participants: ids, enrollment, ground truth, executemany rows.

Shared by the virtual and the live simulator.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import func, select

from ..config import StudyConfig
from ..participants import enroll
from ..schema import Participant, Task
from ..storage import Database
from .model import Population
from .params import SimParams

ProgressFn = Callable[[int, int], None]  # (done, total)


def participant_ids(n: int, first_index: int = 0, prefix: str = "sim") -> list[str]:
    """Ids of simulated participants: ``sim-001``, ``sim-002``, ..."""
    return [f"{prefix}-{i + 1:03d}" for i in range(first_index, first_index + n)]


def new_seed() -> int:
    """A fresh seed for runs that were not given one (recorded in the ground truth)."""
    return secrets.randbits(32)


def ground_truth_rows(config: StudyConfig, params: SimParams, pop: Population, seed: int,
                      *, mode: str = "virtual", **extra: Any) -> list[dict[str, Any]]:
    """Rows for the ``ground_truth`` table: one population row, one per participant."""
    switch_min = config.capture.switch_min_away_s
    from scipy.stats import norm

    # Share of switches long enough to count under the study's switch definition.
    counted = float(norm.sf((np.log(switch_min) - np.log(params.time_away.median))
                            / max(params.time_away.logsd, 1e-9)))
    population = {
        **params.truth_summary(),
        "params": params.model_dump(mode="json"),
        "seed": seed,
        "mode": mode,
        "time_scale": config.study.time_scale,
        "participants": list(pop.ids),
        "share_of_switches_counted": counted,
        "switch_min_away_s": switch_min,
        **extra,
    }
    rows = [{"id": None, "scope": "population", "participant_id": None,
             "truth_model": params.truth, "params_json": json.dumps(population)}]
    for pid, row in zip(pop.ids, pop.truth_rows(), strict=True):
        rows.append({"id": None, "scope": "participant", "participant_id": pid,
                     "truth_model": params.truth, "params_json": json.dumps(row)})
    return rows


def frame_rows(df: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """DataFrame -> list of plain dicts for executemany (NaN/NA become NULL)."""
    cols = [c for c in df.columns if c not in drop]
    values = []
    for c in cols:
        s = df[c]
        # Plain Python scalars (sqlite3 does not take numpy types), None for missing values.
        col = s.astype(object).where(s.notna(), None).tolist() if s.hasnans or s.dtype == object \
            or isinstance(s.dtype, pd.api.extensions.ExtensionDtype) else s.tolist()
        values.append(col)
    return [dict(zip(cols, row, strict=True)) for row in zip(*values, strict=True)]


@dataclass
class SimulationResult:
    """What a simulation wrote."""

    participants: list[str]
    cycles: int
    events: int
    tasks: int
    seed: int
    mode: str = "virtual"
    extra: dict[str, Any] = field(default_factory=dict)


def next_participant_index(database: Database) -> tuple[int, int]:
    """(number of enrolled participants, next free task id) of a database."""
    with database.session() as s:
        n = s.execute(select(func.count()).select_from(Participant)).scalar_one()
        t = s.execute(select(func.max(Task.id))).scalar_one()
    return int(n), int(t or 0) + 1


def enroll_simulated(database: Database, config: StudyConfig, n: int,
                     progress: ProgressFn | None = None) -> tuple[list[str], list[str], int]:
    """Enroll ``n`` simulated participants with fresh ids; returns (ids, keys, first index)."""
    first, _ = next_participant_index(database)
    ids = participant_ids(n, first)
    keys = []
    for i, pid in enumerate(ids):
        _, key, _ = enroll(database, config, pid, simulated=True)
        keys.append(key)
        if progress:
            progress(i + 1, n)
    return ids, keys, first


@contextmanager
def keep_open(database: Database) -> Iterator[None]:
    """Hold one connection open meanwhile: SQLite checkpoints the WAL (with fsyncs) whenever
    its last connection closes, which would happen after every one of the many short
    sessions (each enrollment is its own transaction)."""
    if not database.url.startswith("sqlite"):
        yield
        return
    with database.engine.connect():
        yield
