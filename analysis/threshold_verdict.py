"""The flow-threshold verdict in one place (docs/concepts/analysis.md#flow-threshold): the
rules that decide whether a threshold is reported, used by `flowtrial threshold`, the
report, the dashboard (through the report's JSON) and the notebooks.

`analyse_threshold` runs the whole analysis of one cycle table (the pooled existence test,
the personal threshold and the verdict) and returns the JSON-ready answer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .personal_threshold import ProgressFn, fit_personal_threshold
from .threshold import fit_threshold, smooth_vs_hinge_text


def personal_verdict(personal: dict[str, Any], pooled: dict[str, Any], waits_s: np.ndarray,
                     *, alpha: float = 0.05, max_ci_decades: float = 1.0
                     ) -> tuple[bool, str | None]:
    """Is a personal threshold reported? Switching must depend on the wait (the pooled
    existence test), rise above the breakpoint (b > 0), the random-breakpoint hinge must beat
    the random-intercept smooth logistic on AIC and BIC, and the CI of e^c must span at most
    ``max_ci_decades`` and stay inside the observed waits. Returns (found, reason)."""
    p = pooled.get("p_exists")
    ci = personal["ci_s"]
    aic, bic = personal["aic"], personal["bic"]
    if p is None or p >= alpha:
        return False, ("No threshold: no evidence that switching depends on the wait "
                       f"(p_exists = {_num(p)} >= {alpha:g})")
    if personal["slope_b"] <= 0:
        return False, "No threshold: switching does not rise above the breakpoint (slope <= 0)"
    if not (aic["hinge"] < aic["smooth"] and bic["hinge"] < bic["smooth"]):
        return False, "No threshold: " + smooth_vs_hinge_text(
            aic, bic, "random intercepts in both")
    if math.log10(ci[1] / ci[0]) > max_ci_decades:
        return False, (f"No threshold: the 95 % CI of the median personal threshold "
                       f"({ci[0]:.3g}–{ci[1]:.3g} s) spans more than {max_ci_decades:g} decade")
    lo, hi = float(np.min(waits_s)), float(np.max(waits_s))
    if ci[0] <= lo * (1 + 1e-6) or ci[1] >= hi * (1 - 1e-6):
        return False, (f"No threshold: the 95 % CI of the median personal threshold "
                       f"({ci[0]:.3g}–{ci[1]:.3g} s) reaches the edge of the observed waits")
    return True, None


def _num(x: Any) -> str:
    return "—" if x is None else f"{float(x):.3g}"


def analyse_threshold(frame: pd.DataFrame, *, detection_share: float = 1.0, n_boot: int = 200,
                      n_null: int = 200, seed: int = 0, workers: int | None = None,
                      progress: ProgressFn | None = None, node_check: bool = True,
                      alpha: float = 0.05) -> dict[str, Any]:
    """The whole threshold analysis of cycles (`participant_id`, `wait_s`, `switched`):
    ``{"found", "reason", "personal", "pooled"}`` as `flowtrial threshold --json` prints."""
    pooled = fit_threshold(frame, n_boot=n_boot, n_null=n_null, seed=seed)
    personal = fit_personal_threshold(frame, detection_share=detection_share, workers=workers,
                                      progress=progress, node_check=node_check)
    pooled_d, pers = pooled.to_dict(), personal.to_dict()
    waits = frame["wait_s"].to_numpy(float)
    found, reason = personal_verdict(pers, pooled_d, waits[np.isfinite(waits) & (waits > 0)],
                                     alpha=alpha)
    return {"found": found, "reason": reason, "personal": pers, "pooled": pooled_d}


__all__ = ["analyse_threshold", "personal_verdict"]
