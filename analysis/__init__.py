"""flowtrial analysis: the preregistered estimators (docs/concepts/analysis.md).

- `flowtrial.analysis.effects`: METR-style task-time effect (`estimate_effect`).
- `flowtrial.analysis.threshold`: the flow threshold ψ (`fit_threshold`);
  `flowtrial.analysis.threshold_truth`: ψ under a known truth (`simulate_switch_data`,
  `population_onset_psi`, `pseudo_true_psi`).
- `flowtrial.analysis.checks`: checks first (`srm_check`, `carryover_check`, `manipulation_check`,
  `missing_data`); `flowtrial.analysis.manipulation`: the manipulation check.

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
    "EffectResult": ".effects",
    "estimate_effect": ".effects",
    "ThresholdResult": ".threshold",
    "fit_threshold": ".threshold",
    "simulate_switch_data": ".threshold_truth",
    "population_onset_psi": ".threshold_truth",
    "SRMResult": ".checks",
    "CarryoverResult": ".checks",
    "ManipulationResult": ".manipulation",
    "MissingDataResult": ".checks",
    "srm_check": ".checks",
    "carryover_check": ".checks",
    "manipulation_check": ".manipulation",
    "missing_data": ".checks",
}

__all__ = ["AnalysisInputError", *_EXPORTS]


def __getattr__(name: str) -> Any:
    # PEP 562 lazy re-export: keeps CLI start-up fast.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
