"""flowtrial analysis: the preregistered estimators (DESIGN §6).

- `analysis.effects`: METR-style task-time effect (`estimate_effect`).
- `analysis.threshold`: the flow threshold ψ (`fit_threshold`, `simulate_switch_data`,
  `population_onset_psi`).
- `analysis.checks`: checks first (`srm_check`, `carryover_check`, `manipulation_check`,
  `missing_data`).

Public names are re-exported lazily so that `import analysis` (e.g. by the CLI) does not
pay for importing statsmodels/scipy until an estimator is actually used.
"""

from __future__ import annotations

import importlib
from typing import Any


class AnalysisInputError(ValueError):
    """The input cannot be analysed as asked. The message is one line naming the problem
    and what to do; the CLI prints it on stderr and exits with code 2."""


_EXPORTS: dict[str, str] = {
    "EffectResult": "analysis.effects",
    "estimate_effect": "analysis.effects",
    "ThresholdResult": "analysis.threshold",
    "fit_threshold": "analysis.threshold",
    "simulate_switch_data": "analysis.threshold",
    "population_onset_psi": "analysis.threshold",
    "SRMResult": "analysis.checks",
    "CarryoverResult": "analysis.checks",
    "ManipulationResult": "analysis.checks",
    "MissingDataResult": "analysis.checks",
    "srm_check": "analysis.checks",
    "carryover_check": "analysis.checks",
    "manipulation_check": "analysis.checks",
    "missing_data": "analysis.checks",
}

__all__ = ["AnalysisInputError", *_EXPORTS]


def __getattr__(name: str) -> Any:
    # PEP 562 lazy re-export: keeps CLI start-up fast.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
