"""The proxy's runtime tuning (runtime_tuning.py): applied by the app, undone after it."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from flowtrial.instrumentation.proxy.runtime_tuning import (
    SWITCH_INTERVAL_S,
    WRITER_NICE,
    tuned_process,
)
from flowtrial.instrumentation.proxy.state import close_writer, make_writer
from flowtrial.study.participants import enroll
from flowtrial.study.schema import Cycle
from flowtrial.study.storage import WriteBatch, init_db
from tests.study.conftest import make_config
from tests.study.test_storage import cycle_row


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_proxy_writer_thread_runs_nicer_than_the_event_loop(tmp_path: Path) -> None:
    """The proxy's writer yields the CPU to the event loop (and still writes)."""
    cfg = make_config()
    db = init_db(tmp_path / "s.db", cfg)
    enroll(db, cfg, "p01")
    assert WRITER_NICE > 0
    process_nice = os.getpriority(os.PRIO_PROCESS, 0)
    writer = make_writer(db)
    try:
        writer.write(WriteBatch(Cycle, [cycle_row("p01", 1)]))  # the thread has started
        tid = writer._thread.native_id
        assert tid is not None
        assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, process_nice + WRITER_NICE)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == process_nice
    finally:
        close_writer(writer)


def test_the_running_proxy_shortens_the_switch_interval_and_restores_it(make_study) -> None:
    """The app's lifespan applies the GIL hand-over interval; it is undone when it stops."""
    from flowtrial.instrumentation.proxy.server import serve_proxy

    s = make_study()
    before = sys.getswitchinterval()
    with serve_proxy(s.db, s.config):
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before


def test_nested_tuning_keeps_the_shortest_interval_until_the_last_leaves() -> None:
    before = sys.getswitchinterval()
    with tuned_process(0.0002):
        with tuned_process(0.004):
            assert sys.getswitchinterval() == pytest.approx(min(before, 0.0002))
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.0002))
    assert sys.getswitchinterval() == before
