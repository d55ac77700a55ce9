"""`run_until`: the job-order prefix after which a stop rule holds, whatever the workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flowtrial.analysis.workers import Background, run_jobs, run_until


def _square(k: int, marks: str) -> int:
    Path(marks, str(k)).touch()  # which jobs ran at all
    time.sleep(0.05)  # long enough that the stop comes before the workers run all 40 jobs
    return k * k


@pytest.mark.parametrize("workers", [1, 2])
def test_run_until_returns_the_shortest_prefix_in_job_order(tmp_path: Path,
                                                            workers: int) -> None:
    jobs = [(k, str(tmp_path)) for k in range(40)]
    got = run_until(_square, jobs, lambda out: sum(v > 20 for v in out) >= 2, workers)
    assert got == [0, 1, 4, 9, 16, 25, 36]  # stops at the second value above 20
    ran = len(os.listdir(tmp_path))
    assert 7 <= ran < 40  # later jobs were cancelled, not run


def test_run_until_without_a_stop_runs_everything(tmp_path: Path) -> None:
    jobs = [(k, str(tmp_path)) for k in range(5)]
    assert run_until(_square, jobs, lambda out: False, 2) == run_jobs(_square, jobs, 2)


def _sleep_then(value: int, seconds: float) -> int:
    time.sleep(seconds)
    return value


def test_background_job_gives_its_result_or_is_killed() -> None:
    with Background(_sleep_then, 7, 0.1) as job:
        assert job.result() == 7
    t0 = time.perf_counter()
    with Background(_sleep_then, 7, 30.0):
        pass  # leaving the block kills the job: nobody waits 30 s
    assert time.perf_counter() - t0 < 10


def test_run_until_does_not_wait_for_jobs_the_stop_made_useless() -> None:
    """The stop kills the workers still running jobs beyond the prefix (30 s each here):
    shutting the pool down would wait for them and for the jobs queued behind them."""
    jobs = [(k, 0.05 if k < 3 else 30.0) for k in range(10)]
    t0 = time.perf_counter()
    assert run_until(_sleep_then, jobs, lambda out: len(out) >= 3, 2) == [0, 1, 2]
    assert time.perf_counter() - t0 < 15
    # The next pool works as before.
    assert run_jobs(_sleep_then, [(1, 0.01), (2, 0.01)], 2) == [1, 2]
