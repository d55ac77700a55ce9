"""Results that need the analysis layer itself, computed off the page's critical path.

Context switches, resumption lag and the flow threshold are defined by
``flowtrial.analysis.metrics.cycle_table`` (focus timelines joined to every wait) and
``flowtrial.analysis.threshold.fit_threshold``; the dashboard reuses them rather than approximating
them in SQL, so its numbers are the report's. At 100,000 cycles they take a few seconds, more
than a page may take to render, so large studies get them from one background worker: the
page renders its SQL parts at once and a fragment shows these when ready. Small studies
(≤ ``SYNC_CYCLES``) compute inline, which is also what the tests see.

Results are kept per (URL, freshness token, ...) key in a small process-wide table, so every
session and page shares one computation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

SYNC_CYCLES = 20_000
MAX_KEPT = 8
SWITCH_COLUMNS = ["cycle_id", "participant_id", "arm", "task_id", "status", "request_at",
                  "experienced_ttft_s", "total_wait_s", "idle_wait_s", "tokens_completion",
                  "switched", "time_away_s", "resumption_lag_s", "decision", "cycle_time_s",
                  "achieved_tps"]



@dataclass(frozen=True)
class FitSettings:
    """The report's estimator settings (``flowtrial.analysis.report.analyse_tables``), so the
    dashboard's ψ, CI and verdict are the report's for the same cycles: bootstrap and null
    replicates and seed of ``flowtrial analyze``'s defaults, the study's reading speed, and
    the most inclusive switch rule for the share of switches the primary rule detects."""

    n_boot: int = 200
    seed: int = 0
    reading_tps: float = 5.3
    all_switch_col: str | None = None


def report_settings(url: str) -> FitSettings:
    """:class:`FitSettings` of the study at ``url``, chosen the way the report chooses them."""
    import inspect

    from flowtrial.analysis.report import run_analysis
    from flowtrial.analysis.switches import switch_column

    from .data import database

    config = database(url).config()
    defaults = inspect.signature(run_analysis).parameters
    sens = [float(x) for x in config.capture.switch_sensitivity_s]
    shortest = min({2.0, *sens})
    primary = float(config.capture.switch_min_away_s)
    return FitSettings(n_boot=int(defaults["n_boot"].default),
                       seed=int(defaults["seed"].default),
                       reading_tps=float(config.analysis.reading_tps),
                       all_switch_col=switch_column(shortest) if shortest < primary else None)


#: Bootstrap and null replicates of the dashboard's pooled fit: the report's 200 took over
#: five minutes for a 120-cycle study on a loaded 2-core machine, too long for a page. Only
#: ψ*'s bootstrap CI and the existence test's p depend on it; the headline (median personal
#: threshold, its profile CI, τ) does not. The page labels these as quick estimates.
QUICK_BOOT = 50


def dashboard_settings(url: str) -> FitSettings:
    """The report's settings with :data:`QUICK_BOOT` replicates."""
    import dataclasses

    return dataclasses.replace(report_settings(url), n_boot=QUICK_BOOT)


_lock = threading.Lock()
_results: OrderedDict[Hashable, Future[Any]] = OrderedDict()
_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowtrial-dashboard")


def submit(key: Hashable, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """The future of ``fn(*args)`` under ``key``, started once per key (process-wide)."""
    with _lock:
        fut = _results.get(key)
        if fut is None:
            fut = _pool.submit(fn, *args)
            _results[key] = fut
            while len(_results) > MAX_KEPT:
                _results.popitem(last=False)
        else:
            _results.move_to_end(key)
        return fut


def get(key: Hashable, fn: Callable[..., Any], *args: Any, block: bool) -> Any | None:
    """The result, or None while it is still computing (when not ``block``).

    A failed computation re-raises here, on the page, where Streamlit shows it."""
    fut = submit(key, fn, *args)
    if block or fut.done():
        return fut.result()
    return None


def _switch_table(url: str) -> pd.DataFrame:
    from flowtrial.analysis.metrics import cycle_table

    from .data import database

    table = cycle_table(database(url))
    keep = [c for c in table.columns if c in SWITCH_COLUMNS or c.startswith("switched_")]
    out = table[keep]
    out.attrs = dict(table.attrs)  # the unit of waiting (cycle or agent turn)
    return out


def switch_table(url: str, fresh: tuple[int, ...], *, block: bool | None = None
                 ) -> pd.DataFrame | None:
    """``flowtrial.analysis.metrics.cycle_table`` (the columns the pages use) for the whole
    study."""
    block = fresh[0] <= SYNC_CYCLES if block is None else block
    return get(("cycles", url, fresh), _switch_table, url, block=block)


def filter_cycles(table: pd.DataFrame, f: Any, task_names: dict[int, str] | None = None
                  ) -> pd.DataFrame:
    """Apply the sidebar filters to a cycle table (same meaning as ``data.cycle_where``)."""
    keep = np.ones(len(table), dtype=bool)
    if f.start is not None:
        keep &= (table["request_at"] >= pd.Timestamp(f.start, tz="UTC")).to_numpy()
    if f.end is not None:
        keep &= (table["request_at"] < pd.Timestamp(f.end, tz="UTC")
                 + pd.Timedelta(days=1)).to_numpy()
    if f.participants:
        keep &= table["participant_id"].isin(f.participants).to_numpy()
    if f.arms:
        keep &= table["arm"].isin(f.arms).to_numpy()
    if f.tasks:
        ids = [i for i, n in (task_names or {}).items() if n in f.tasks]
        keep &= table["task_id"].isin(ids).fillna(False).to_numpy(dtype=bool)
    return table[keep]


def _fit(cycles: pd.DataFrame, wait_col: str, s: FitSettings) -> tuple[dict[str, Any], Any]:
    from flowtrial.analysis.report_sections import threshold_section

    return threshold_section(cycles, wait_col, "switched", n_boot=s.n_boot, seed=s.seed)


def _personal(cycles: pd.DataFrame, wait_col: str, summary: dict[str, Any],
              s: FitSettings) -> dict[str, Any]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from flowtrial.analysis.report_sections import personal_section

    all_col = s.all_switch_col if s.all_switch_col in cycles.columns else None
    # tokens_completion: the answer lengths of the speed table (what a model speed means).
    cols = [c for c in ("participant_id", "status", wait_col, "switched", all_col,
                        "tokens_completion") if c and c in cycles.columns]
    # In a spawned process: a fit on this server thread would hold the GIL against the page
    # scripts for seconds, and forking a threaded server is unsafe.
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(personal_section, cycles[cols], wait_col, "switched", summary,
                           reading_tps=s.reading_tps, all_switch_col=all_col, workers=1).result()


def personal_fit(key: Hashable, cycles: pd.DataFrame, wait_col: str, summary: dict[str, Any],
                 settings: FitSettings, *, block: bool = False) -> dict[str, Any] | None:
    """The report's personal-threshold section (median personal ψ, τ, verdict: the report's
    headline) on ``cycles``, or None while it is still being fitted (it takes longer than
    ψ*)."""
    return get(("personal", key, wait_col, settings), _personal, cycles, wait_col, summary,
               settings, block=block)


def threshold_fit(key: Hashable, cycles: pd.DataFrame, wait_col: str, settings: FitSettings,
                  *, block: bool) -> tuple[dict[str, Any], Any] | None:
    """``flowtrial.analysis.report_sections.threshold_section`` (the report's pooled onset ψ*,
    its secondary estimate) on ``cycles``: (summary dict, ``ThresholdResult`` or None when it
    could not be fitted)."""
    return get(("fit", key, wait_col, settings), _fit, cycles, wait_col, settings,
               block=block)


def task_names(url: str, fresh: tuple[int, ...]) -> dict[int, str]:
    """Task id → name, for the task filter on in-memory cycle tables."""
    from sqlalchemy import select

    from .data import TASK, database

    with database(url).engine.connect() as conn:
        return {int(i): str(n) for i, n in conn.execute(select(TASK.id, TASK.name))}
