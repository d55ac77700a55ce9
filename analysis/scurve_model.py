"""The S-curve alternative of the threshold test (issue 27): switching rises from a floor to
a ceiling along a logistic curve in log wait, with no breakpoint, people differing in level
and in the size of their rise.

    logit p_ij = a + σ_u·v_i + e^(τ·z_i)·R·expit((log w_ij − c) / s),   R ≥ 0,   s ≥ `MIN_WIDTH`

ρ = (R, c, s): the rise R, its midpoint e^c (inside the observed waits) and its width s. The
monotone spline cannot bend twice, so an S-curve seen whole (a floor, a rise, a ceiling) was
explained better by the hinge than by any other alternative and passed as a threshold at the
foot of its rise. Its width is bounded below so that it cannot become a step: the slope of
the S-curve's lower bend goes from 10 % to 90 % of its steepest over at least
`rb_model.ONSET_FACTOR` of the wait, the yardstick of the rounded onset, so the two
alternatives draw the line between a threshold and a gradual onset at the same place.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from .rb_model import ONSET_FACTOR, CycleData
from .scaled_rise import ScaledRiseModel

#: The lower bend of expit(u) spans u from logit((1 − √0.9)/2) (slope 10 % of its steepest)
#: to logit((1 − √0.1)/2) (90 %), about 2.98 units.
LOWER_BEND_UNITS = (math.log((1 - math.sqrt(0.1)) / (1 + math.sqrt(0.1)))
                    - math.log((1 - math.sqrt(0.9)) / (1 + math.sqrt(0.9))))
#: The narrowest width: a lower bend over `ONSET_FACTOR` of the wait (s ≈ 0.74 for a factor 9).
MIN_WIDTH = math.log(ONSET_FACTOR) / LOWER_BEND_UNITS


class SCurveModel(ScaledRiseModel):
    """Negative marginal log-likelihood of the S-curve alternative (module docstring)."""

    kind = "scurve"

    def __init__(self, data: CycleData, nodes: tuple[int, ...] = (12, 5), *,
                 detection: float = 1.0) -> None:
        self.x_range = (float(data.x.min()), float(data.x.max()))
        super().__init__(data, nodes, detection=detection)

    def rise_bounds(self) -> list[tuple[float | None, float | None]]:
        return [(0.0, 30.0), self.x_range, (MIN_WIDTH, 3.0)]

    def rise(self, rho: np.ndarray, x: np.ndarray) -> np.ndarray:
        r, c, s = (float(t) for t in rho)
        return np.asarray(r * expit((x - c) / s))

    def rise_jacobian(self, rho: np.ndarray) -> np.ndarray:
        r, c, s = (float(t) for t in rho)
        u = (self.d.x - c) / s
        e = expit(u)
        de = e * (1.0 - e)
        return np.column_stack([e, -r * de / s, -r * de * u / s])


__all__ = ["LOWER_BEND_UNITS", "MIN_WIDTH", "SCurveModel"]
