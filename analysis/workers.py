"""Running independent CPU-bound analysis jobs (threshold fits, power replicates) on a few
worker processes.

Workers run single-threaded BLAS: the fits are many small numpy operations, and two
processes each running a multi-threaded BLAS on two cores mostly contend with each other
(measured: 5 threshold fits on 20,000 cycles take 21 s that way, 12.5 s with one BLAS
thread per worker). Where ``fork`` exists (Linux) workers are forked — a script that calls
the analysis without an ``if __name__ == "__main__"`` guard keeps working — and limit BLAS
with ``threadpoolctl`` when it is installed; elsewhere they are spawned with the BLAS
thread variables set. Jobs are seeded by the caller, so results do not depend on the
number of workers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any

SINGLE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                     "MKL_NUM_THREADS": "1"}


def default_workers(limit: int = 2) -> int:
    """Worker processes to use: the CPUs available to us, at most ``limit``."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, limit))


def _start_method() -> str:
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _single_thread_blas() -> None:
    """Worker initializer: one BLAS thread (forked workers inherit the parent's pool size)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it forked workers keep the parent's BLAS threads
        return
    threadpool_limits(1)


def run_until(
    fn: Callable[..., Any],
    jobs: Sequence[tuple[Any, ...]],
    stop: Callable[[list[Any]], bool],
    workers: int | None = None,
    *,
    on_done: Callable[[int, int], None] | None = None,
    while_waiting: Callable[[], None] | None = None,
) -> list[Any]:
    """The shortest prefix ``[fn(*job) for job in jobs[:L]]`` after which ``stop(prefix)``
    holds (all jobs when it never does), in up to ``workers`` processes (default: up to 2
    CPUs). The prefix is taken in job order, whatever order the workers finish in, so the
    result does not depend on the number of workers; jobs not yet started when it is decided
    are cancelled. ``on_done(done, total)`` reports progress; ``while_waiting`` runs in this
    process while the workers compute."""
    total = len(jobs)
    n = min(workers if workers is not None else default_workers(), total)
    if n <= 1:
        if while_waiting is not None:
            while_waiting()
        out: list[Any] = []
        for i, job in enumerate(jobs):
            out.append(fn(*job))
            if on_done:
                on_done(i + 1, total)
            if stop(out):
                break
        return out
    done: dict[int, Any] = {}
    prefix: list[Any] = []
    with _pool(n) as pool:
        with _single_thread_env():
            futures = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        if while_waiting is not None:
            while_waiting()
        for f in as_completed(futures):
            done[futures[f]] = f.result()
            if on_done:
                on_done(len(done), total)
            while len(prefix) in done:
                prefix.append(done[len(prefix)])
                if stop(prefix):
                    _stop_now(pool)
                    return prefix
    return prefix


def _stop_now(pool: ProcessPoolExecutor) -> None:
    """Cancel the jobs not started and kill the workers running the rest: shutting down
    waits for every job already handed to a worker, and the executor hands a worker a job
    beyond the one it runs (measured: 3 jobs more, 15 s where 0.4 s were needed)."""
    # The executor has no public way to stop a running job; its worker processes are
    # `_processes` (pid -> Process) in every CPython version that has `cancel_futures`.
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join()


def _pool(n: int) -> ProcessPoolExecutor:
    """A pool of ``n`` single-BLAS-thread workers (forked where possible)."""
    return ProcessPoolExecutor(n, mp_context=mp.get_context(_start_method()),
                               initializer=_single_thread_blas)


@contextmanager
def _single_thread_env() -> Iterator[None]:
    """The BLAS thread variables set while jobs are submitted: workers start during the
    submits, and spawned ones read the environment then."""
    saved = {k: os.environ.get(k) for k in SINGLE_THREAD_ENV}
    os.environ.update(SINGLE_THREAD_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _nice_worker() -> None:
    """Initializer of a speculative worker: lowest CPU priority, one BLAS thread."""
    os.nice(19)  # it takes only the CPU the other workers leave idle
    _single_thread_blas()


class Background:
    """One job on a process of its own, started now at the lowest CPU priority, beside
    whatever runs next: `result` waits for it, `cancel` kills it (a speculative job that
    turned out not to be needed takes only idle CPU). Use as a context manager; leaving it
    cancels an unfinished job."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        with _single_thread_env():
            self._pool = mp.get_context(_start_method()).Pool(1, initializer=_nice_worker)
        self._job = self._pool.apply_async(fn, args)

    def result(self) -> Any:
        """The job's return value (waits for it)."""
        out = self._job.get()
        self._pool.close()
        return out

    def cancel(self) -> None:
        """Kill the job if it still runs."""
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def run_jobs(
    fn: Callable[..., Any],
    jobs: Sequence[tuple[Any, ...]],
    workers: int | None = None,
    *,
    on_done: Callable[[int, int], None] | None = None,
    while_waiting: Callable[[], None] | None = None,
) -> list[Any]:
    """``[fn(*job) for job in jobs]`` in up to ``workers`` processes, in job order
    (`run_until` without a stop)."""
    return run_until(fn, jobs, lambda _: False, workers, on_done=on_done,
                     while_waiting=while_waiting)
