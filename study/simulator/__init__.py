"""Simulated participants with known ground truth (DESIGN.md §7).

One behaviour model (:mod:`study.simulator.model`, parameters in
:mod:`study.simulator.params`) drives two modes: **virtual** (no HTTP; numpy writes the
study tables directly, fast enough for power analysis) and **live** (concurrent clients using
the official ``openai`` SDK against the real proxy, posting focus and decision events to its
event API).
"""

from study.simulator.params import SimParams, switch_probability
from study.simulator.records import SimulationResult
from study.simulator.virtual import simulate_virtual, simulate_virtual_frames
from study.timeline import idle_wait_s

__all__ = [
    "SimParams",
    "SimulationResult",
    "idle_wait_s",
    "simulate_virtual",
    "simulate_virtual_frames",
    "switch_probability",
]
