"""Fixtures shared with the instrumentation tests (re-exported so pytest finds them here)."""

from tests.instrumentation.conftest import fine_gil_switching, make_study

__all__ = ["fine_gil_switching", "make_study"]
