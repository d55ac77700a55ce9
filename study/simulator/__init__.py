"""Simulated participants with known ground truth (docs/concepts/simulated-participants.md).

One behaviour model (:mod:`flowtrial.study.simulator.model`, parameters in
:mod:`flowtrial.study.simulator.params`) drives two modes: **virtual** (no HTTP; numpy writes the
study tables directly, fast enough for power analysis) and **live** (concurrent clients using
the official ``openai`` SDK against the real proxy, posting focus and decision events to its
event API).
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use: `flowtrial simulate --help` must not import pandas.
_EXPORTS = {
    "SimParams": ".params",
    "switch_probability": ".params",
    "SimulationResult": ".records",
    "simulate_virtual": ".virtual",
    "simulate_virtual_frames": ".virtual",
    "idle_wait_s": "..timeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
