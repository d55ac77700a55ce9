"""Which study database the analysis notebooks read.

``FLOWTRIAL_DB`` names it (a SQLite path or a SQLAlchemy URL; ``flowtrial notebooks --db``
sets it). Without it, the notebooks use the demo's database, ``flowtrial-demo/flowtrial.db``
(what ``flowtrial demo`` writes by default; ``flowtrial.demo`` holds the same names and a test
keeps them equal), looked for in the folder Jupyter started in and every folder above it — so
a notebook opened in ``analysis/notebooks/`` finds the demo run from the repository root, and
one opened from the root finds it too.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import AnalysisInputError

ENV_VAR = "FLOWTRIAL_DB"
DEMO_DIR = "flowtrial-demo"
DEMO_DB_NAME = "flowtrial.db"


def find_demo_database(*starts: Path) -> Path | None:
    """The nearest ``flowtrial-demo/flowtrial.db`` in each start folder or a folder above it."""
    for start in starts:
        here = start.resolve()
        for folder in (here, *here.parents):
            candidate = folder / DEMO_DIR / DEMO_DB_NAME
            if candidate.is_file():
                return candidate
    return None


def study_database(start: Path | None = None) -> str:
    """``FLOWTRIAL_DB``, else the demo's database found from ``start`` (default: the working
    folder); a one-line error saying where it looked when there is neither."""
    named = os.environ.get(ENV_VAR)
    if named:
        return named
    here = Path.cwd() if start is None else start
    found = find_demo_database(here)
    if found is None:
        raise AnalysisInputError(
            f"no study database: set {ENV_VAR} to one (or start Jupyter with `flowtrial "
            f"notebooks --db FILE`), or run `flowtrial demo` first; looked for "
            f"{DEMO_DIR}/{DEMO_DB_NAME} in {here.resolve()} and the folders above it")
    return str(found)
