"""The likelihood shared by the threshold test's smooth alternatives (issue 27): switching
rises along a curve in log wait, people differ in their level and in the size of their rise.

    logit p_ij = a + σ_u·v_i + e^(τ·z_i)·rise(log w_ij; ρ),   z_i, v_i ~ N(0, 1)

θ = (a, σ_u, τ, ρ…). A subclass says what the rise is (`rise` and its Jacobian in ρ): the
monotone spline (`spline_model`) or the S-curve (`scurve_model`). The marginal likelihood is
integrated by Gauss–Hermite quadrature (`rb_model.gh_nodes`) and maximised with the analytic
gradient, as the hinge is; the detection share d enters as in the hinge:
P(counted switch) = d·expit(η).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .rb_model import CycleData, check_detection, two_effect_grid
from .switch_loglik import log_p, row_sums, weight_rows


class ScaledRiseModel:
    """Negative marginal log-likelihood of a person-scaled rise (module docstring)."""

    kind = "scaled_rise"
    sd_params = (1, 2)
    #: Bounds of (a, σ_u, τ); a subclass appends those of ρ in `rise_bounds`.
    base_bounds: list[tuple[float | None, float | None]] = [(-15.0, 15.0), (0.0, 5.0),
                                                            (0.0, 3.0)]

    def __init__(self, data: CycleData, nodes: tuple[int, ...] = (12, 5), *,
                 detection: float = 1.0) -> None:
        self.d = data
        self.detection = check_detection(detection)
        self.z, self.v, self.log_w = two_effect_grid(nodes)
        self.sign = (2.0 * data.y - 1.0)[:, None]
        self.no_switch = (data.y <= 0.5).astype(float)[:, None]
        self.ends = data.ends
        self.bounds = self.base_bounds + self.rise_bounds()
        self.n_evals = 0

    def rise_bounds(self) -> list[tuple[float | None, float | None]]:
        """Bounds of ρ (a subclass's)."""
        raise NotImplementedError

    def rise(self, rho: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The typical person's rise at log waits ``x``."""
        raise NotImplementedError

    def rise_jacobian(self, rho: np.ndarray) -> np.ndarray:
        """(N, len(ρ)): ∂rise/∂ρ at the data's log waits."""
        raise NotImplementedError

    def curve(self, theta: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The typical person's (v = z = 0) linear predictor at log waits ``x``."""
        return float(theta[0]) + self.rise(np.asarray(theta[3:], float), np.asarray(x, float))

    def nll(self, theta: np.ndarray, need_grad: bool = True) -> tuple[float, np.ndarray]:
        """(−ℓ, −∂ℓ/∂θ) at θ = (a, σ_u, τ, ρ…)."""
        self.n_evals += 1
        a, su, tau = (float(t) for t in theta[:3])
        rho = np.asarray(theta[3:], float)
        rise = self.rise(rho, self.d.x)  # (N,)
        ez = np.exp(tau * self.z)  # (nz,)
        n, nz, nv = rise.size, ez.size, self.v.size
        eta = (a + rise[:, None, None] * ez[None, :, None]
               + su * self.v[None, None, :]).reshape(n, nz * nv)
        ll, score = log_p(eta, self.sign, self.no_switch, self.detection, out=np.empty_like(eta))
        per = row_sums(ll, self.d.starts, self.ends) + self.log_w
        tot = logsumexp(per, axis=1)
        f = -float(tot.sum())
        if not need_grad:
            return f, np.zeros(len(theta))
        weight_rows(score, np.exp(per - tot[:, None]), self.d.starts, self.ends)
        r3 = score.reshape(n, nz, nv)
        rz = r3.sum(axis=2)  # (N, nz)
        g = np.zeros(len(theta))
        g[0] = rz.sum()
        g[1] = float(r3.sum(axis=(0, 1)) @ self.v)
        g[2] = float(rise @ (rz @ (ez * self.z)))
        g[3:] = self.rise_jacobian(rho).T @ (rz @ ez)
        return f, -g


__all__ = ["ScaledRiseModel"]
