"""The flow threshold ψ (docs/concepts/analysis.md#flow-threshold).

Model: P(context switch during a wait of w seconds) follows a hinge logistic

    logit p = a + b · max(0, log w − log ψ)

(flat below ψ, rising in log w above it), fitted to all cycles pooled, with participants as
the resampling clusters:

* ψ by profile likelihood over a grid of log ψ between the 5th and 95th percentile of the
  observed log waits, refined by a parabola through the best grid point and its neighbours;
* 95 % CI for ψ from a participant-cluster bootstrap (resample participants with
  replacement, refit the whole profile): the union of (i) the BCa interval of log ψ*
  (acceleration from a delete-one-participant jackknife) and (ii) the profile-likelihood
  interval {ψ : 2(ℓ(ψ̂) − ℓ(ψ)) ≤ q}, q = 95th percentile of the bootstrap profile LR at ψ̂.
  The estimate's standard error shrinks when ψ̂ is overestimated (steeper fitted rise), which
  makes plain percentile intervals undercover; each of (i), (ii) covers ~0.92–0.93 with 40
  participants in simulation, their union ~0.94 (benchmarks/bench_threshold_quality.py);
* existence test: LR = 2(ℓ_hinge − ℓ_flat) against the intercept-only model, calibrated by a
  parametric bootstrap under the null. The null keeps each participant's own switch rate
  (a composite null "no dependence on the wait"), so between-participant differences in
  switching propensity cannot masquerade as a wait effect when waits differ by participant;
* comparison with the smooth logistic `logit p = a + b · log w` (and the flat model) by AIC
  and BIC, counting ψ as a parameter (k = 3 for the hinge, 2 smooth, 1 flat).

The hinge is reported ("found") only when the existence test rejects at α, the slope above
ψ is positive, the hinge beats the smooth model on both AIC and BIC, and the CI for ψ spans
at most one decade and stays inside the observed wait range.

Estimand: the pooled model describes the population-averaged curve. When individual thresholds
vary (docs/concepts/simulated-participants.md: log-sd 0.35), its ψ is the onset of that
averaged curve, which lies below the median individual threshold (≈ 6.8 s for a median of 8 s
with the default simulator; `population_onset_psi` computes it for any simulator setting).

Speed (`pooled_fit`): the 2-parameter logistic fits are a vectorised Newton–Raphson over all
grid points at once (one column per ψ), on binomial sufficient statistics: cycles are aggregated by
participant × log-wait bin. When there are at most `max_bins` distinct waits this is exact;
otherwise waits are put in `max_bins` equal-width bins of log w and each bin is represented by
the mean log wait of its cycles (width ≈ 0.02 in log w, i.e. 2 % of the wait, for a
0.2–60 s range — far below the resolution of the ψ grid). Bootstrap replicates then only
re-weight participants, and null replicates only redraw the switch counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from . import AnalysisInputError
from .pooled_fit import Binned, PooledProblem, bin_cycles, expit

ModelName = Literal["flat", "smooth", "hinge"]
_K_PARAMS = {"flat": 1, "smooth": 2, "hinge": 3}  # ψ counts as a parameter of the hinge


# ---------------------------------------------------------------------------- result


@dataclass
class ThresholdResult:
    """Outcome of `fit_threshold`. `psi_s`/`ci_s` are the hinge estimates; interpret them only
    when `found` is True (otherwise `reason` says why no threshold is reported)."""

    psi_s: float
    ci_s: list[float]
    ci_lr_s: list[float]
    ci_bca_s: list[float]
    ci_percentile_s: list[float]
    ci_lr_crit: float
    p_exists: float
    lr_stat: float
    model_choice: ModelName
    found: bool
    reason: str | None
    aic: dict[str, float]
    bic: dict[str, float]
    loglik: dict[str, float]
    params: dict[str, dict[str, float]]
    n_obs: int
    n_participants: int
    n_switches: int
    dropped: int
    grid_s: list[float]
    profile_loglik: list[float]
    n_boot: int
    n_null: int
    seed: int
    alpha: float
    exact: bool
    boot_hinge: np.ndarray = field(repr=False, default_factory=lambda: np.empty((0, 3)))
    boot_smooth: np.ndarray = field(repr=False, default_factory=lambda: np.empty((0, 2)))
    x_center: float = 0.0

    def curve(
        self, wait_grid: Sequence[float] | np.ndarray, level: float = 0.95
    ) -> dict[str, np.ndarray]:
        """Fitted P(switch) at the given waits (seconds) for plotting: `hinge`, `smooth`,
        `flat`, and pointwise bootstrap bands `hinge_lo/hinge_hi`, `smooth_lo/smooth_hi`."""
        w = np.asarray(wait_grid, dtype=float)
        if np.any(w <= 0):
            raise AnalysisInputError("curve(): waits must be > 0 seconds")
        x = np.log(w)
        ha, hb, hc = (self.params["hinge"][k] for k in ("a", "b", "log_psi"))
        sa, sb = self.params["smooth"]["a"], self.params["smooth"]["b"]
        out: dict[str, np.ndarray] = {
            "wait_s": w,
            "hinge": expit(ha + hb * np.maximum(0.0, x - hc)),
            "smooth": expit(sa + sb * (x - self.x_center)),
            "flat": np.full_like(x, expit(np.array(self.params["flat"]["a"]))),
        }
        q = [(1 - level) / 2, (1 + level) / 2]
        if len(self.boot_hinge):
            bh = self.boot_hinge
            ph = expit(bh[:, :1] + bh[:, 1:2] * np.maximum(0.0, x[None, :] - bh[:, 2:3]))
            out["hinge_lo"], out["hinge_hi"] = np.quantile(ph, q, axis=0)
            bs = self.boot_smooth
            ps = expit(bs[:, :1] + bs[:, 1:2] * (x[None, :] - self.x_center))
            out["smooth_lo"], out["smooth_hi"] = np.quantile(ps, q, axis=0)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the bootstrap draws)."""
        keys = [
            "psi_s",
            "ci_s",
            "ci_lr_s",
            "ci_bca_s",
            "ci_percentile_s",
            "ci_lr_crit",
            "p_exists",
            "lr_stat",
            "model_choice",
            "found",
            "reason",
            "aic",
            "bic",
            "loglik",
            "params",
            "n_obs",
            "n_participants",
            "n_switches",
            "dropped",
            "grid_s",
            "profile_loglik",
            "n_boot",
            "n_null",
            "seed",
            "alpha",
            "exact",
        ]
        return {k: getattr(self, k) for k in keys}


# ------------------------------------------------------------------------------- API


def _prepare(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    if not isinstance(df, pd.DataFrame):
        raise AnalysisInputError("expected a pandas DataFrame of cycles")
    need = ["participant_id", "wait_s", "switched"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise AnalysisInputError(
            f"cycles data lacks column(s) {', '.join(missing)}; "
            "need participant_id, wait_s, switched"
        )
    wait = pd.to_numeric(df["wait_s"], errors="coerce")
    sw_raw = df["switched"]
    sw = pd.to_numeric(sw_raw.astype(float) if sw_raw.dtype == bool else sw_raw, errors="coerce")
    if (wait.isna() & df["wait_s"].notna()).any():
        raise AnalysisInputError("wait_s has non-numeric values; give waits in seconds")
    if (sw.isna() & sw_raw.notna()).any() or (sw.notna() & ~sw.isin([0, 1])).any():
        raise AnalysisInputError("switched must be boolean or 0/1")
    if (wait.notna() & ~np.isfinite(wait.fillna(1.0)) | (wait <= 0)).any():
        raise AnalysisInputError("wait_s must be finite and > 0 seconds (the model uses log wait)")
    keep = wait.notna() & sw.notna() & df["participant_id"].notna()
    dropped = int((~keep).sum())
    pid, _ = pd.factorize(df.loc[keep, "participant_id"])
    return (
        np.log(wait[keep].to_numpy(float)),
        sw[keep].to_numpy(float),
        pid,
        int(pid.max()) + 1 if pid.size else 0,
        dropped,
    )


def _lr_interval(c: np.ndarray, dev: np.ndarray, crit: float, c_hat: float) -> tuple[float, float]:
    """Hull of {c : dev(c) <= crit} on a fine grid, with linear interpolation at the ends
    (clipped to the grid: then the CI reaches the edge of the observed waits)."""
    inside = np.flatnonzero(dev <= crit)
    if inside.size == 0:
        return c_hat, c_hat
    i, j = int(inside[0]), int(inside[-1])
    lo = (
        c[0]
        if i == 0
        else c[i - 1] + (c[i] - c[i - 1]) * (dev[i - 1] - crit) / (dev[i - 1] - dev[i])
    )
    hi = (
        c[-1]
        if j == c.size - 1
        else c[j] + (c[j + 1] - c[j]) * (crit - dev[j]) / (dev[j + 1] - dev[j])
    )
    return float(min(lo, c_hat)), float(max(hi, c_hat))


def _jackknife(
    prob: PooledProblem,
    binned: Binned,
    main: dict[str, Any],
    rng: np.random.Generator,
    max_groups: int = 100,
) -> np.ndarray:
    """Delete-one-participant (or delete-one-group, for > max_groups participants) log ψ."""
    n_part = binned.counts.shape[0]
    groups = np.arange(n_part) if n_part <= max_groups else rng.permutation(n_part) % max_groups
    out = np.empty(int(groups.max()) + 1)
    for g in range(out.size):
        keep = (groups != g).astype(float)
        f = prob.fit(keep @ binned.counts, keep @ binned.succ, start=main.get("start"))
        out[g] = f["hinge"][2]
    return out


def _bca(boot: np.ndarray, est: float, jack: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Bias-corrected and accelerated percentile interval (Efron 1987)."""
    from scipy.stats import norm

    prop = (np.sum(boot < est) + 0.5 * np.sum(boot == est)) / boot.size
    z0 = norm.ppf(np.clip(prop, 1.0 / (boot.size + 1), boot.size / (boot.size + 1)))
    d = jack.mean() - jack
    denom = 6.0 * np.sum(d * d) ** 1.5
    acc = float(np.sum(d**3) / denom) if denom > 0 else 0.0
    z = norm.ppf([(1 - level) / 2, (1 + level) / 2])
    adj = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    return np.quantile(boot, adj)


def _ic(ll: dict[str, float], n: int) -> tuple[dict[str, float], dict[str, float]]:
    aic = {m: 2 * _K_PARAMS[m] - 2 * ll[m] for m in _K_PARAMS}
    bic = {m: _K_PARAMS[m] * math.log(n) - 2 * ll[m] for m in _K_PARAMS}
    return aic, bic


def smooth_vs_hinge_text(aic: dict[str, float], bic: dict[str, float], note: str = "") -> str:
    """Why the hinge lost to the smooth logistic, with the criteria's own numbers (a threshold
    needs the hinge to win on both AIC and BIC; lower is better)."""
    extra = f"; {note}" if note else ""
    nums = (f"AIC {aic['hinge']:.2f} vs {aic['smooth']:.2f}, "
            f"BIC {bic['hinge']:.2f} vs {bic['smooth']:.2f}, hinge vs smooth{extra}")
    if aic["hinge"] < aic["smooth"]:
        return ("AIC favours the hinge but BIC favours the smooth logistic dose-response, "
                f"and a threshold needs both ({nums})")
    if bic["hinge"] < bic["smooth"]:
        return ("BIC favours the hinge but AIC favours the smooth logistic dose-response, "
                f"and a threshold needs both ({nums})")
    return f"a smooth logistic dose-response fits as well or better ({nums})"


def _check_settings(n_boot: int, n_null: int, grid_size: int) -> None:
    if n_boot < 10 or n_null < 10:
        raise AnalysisInputError("n_boot and n_null must be >= 10 (use >= 200 for reporting)")
    if grid_size < 5:
        raise AnalysisInputError("grid_size must be >= 5")


def _psi_grid(logw: np.ndarray, y: np.ndarray, n_part: int,
              wait_quantiles: tuple[float, float], grid_size: int) -> np.ndarray:
    """The log-ψ grid between the wait quantiles, after checking the data can bear a fit."""
    n_obs = int(y.size)
    if n_obs < 20:
        raise AnalysisInputError(f"too few cycles: {n_obs} usable (need >= 20)")
    if n_part < 2:
        raise AnalysisInputError(
            "need cycles from >= 2 participants (participants are the clusters)"
        )
    n_sw = int(y.sum())
    if n_sw == 0 or n_sw == n_obs:
        raise AnalysisInputError(
            f"switched is {'never' if n_sw == 0 else 'always'} 1; "
            "the switch rate cannot depend on the wait"
        )
    lo_q, hi_q = np.quantile(logw, wait_quantiles)
    if hi_q - lo_q < 1e-6:
        raise AnalysisInputError("waits hardly vary; a threshold needs a range of waits")
    return np.linspace(lo_q, hi_q, grid_size)


def existence_test(prob: PooledProblem, binned: Binned, main: dict[str, Any], n_null: int,
                   rng: np.random.Generator) -> tuple[float, float]:
    """(LR, p): parametric bootstrap of the hinge-vs-flat LR under "P(switch) does not
    depend on the wait", each participant keeping their own observed switch rate."""
    lr = max(0.0, 2 * (main["ll_hinge"] - main["ll_flat"]))
    p_i = binned.succ.sum(1) / binned.counts.sum(1)
    n_k = binned.counts.sum(0)
    null_lr = np.empty(n_null)
    for r in range(n_null):
        s_null = rng.binomial(binned.counts.astype(np.int64), p_i[:, None]).sum(0).astype(float)
        f = prob.fit(n_k, s_null)
        null_lr[r] = 2 * (f["ll_hinge"] - f["ll_flat"])
    return lr, float((1 + np.sum(null_lr >= lr - 1e-9)) / (1 + n_null))


def cluster_bootstrap(prob: PooledProblem, binned: Binned, main: dict[str, Any], n_boot: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Participant-cluster bootstrap (resample participants, refit everything, warm start):
    hinge (a, b, log ψ) and smooth (a, b) per replicate, and the profile LR at the original
    estimate, LR* = 2(ℓ*(ψ̂*) − ℓ*(ψ̂)), whose quantile calibrates the profile CI."""
    n_part = binned.counts.shape[0]
    ha0, hb0, hc0 = main["hinge"]
    boot_h = np.empty((n_boot, 3))
    boot_s = np.empty((n_boot, 2))
    boot_lr = np.empty(n_boot)
    for r in range(n_boot):
        m = rng.multinomial(n_part, np.full(n_part, 1.0 / n_part)).astype(float)
        nb, sb = m @ binned.counts, m @ binned.succ
        f = prob.fit(nb, sb, start=main.get("start"))
        boot_h[r] = f["hinge"]
        boot_s[r] = f["smooth"]
        if f["degenerate"]:
            boot_lr[r] = 0.0
            continue
        _, _, ll_at = prob.hinge_at(nb, sb, np.array([hc0]), np.array([ha0]), np.array([hb0]))
        boot_lr[r] = max(0.0, 2 * (f["ll_hinge"] - float(ll_at[0])))
    return boot_h, boot_s, boot_lr


def psi_intervals(prob: PooledProblem, binned: Binned, main: dict[str, Any], boot_h: np.ndarray,
                  boot_lr: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    """ψ's intervals (seconds): percentile, BCa (jackknife acceleration), the profile-LR
    interval at the bootstrap's LR quantile, and the reported union of BCa and LR."""
    ha0, _, hc0 = main["hinge"]
    ci_pct = np.exp(np.quantile(boot_h[:, 2], [0.025, 0.975]))
    jack = _jackknife(prob, binned, main, rng)
    ci_bca = np.exp(_bca(boot_h[:, 2], hc0, jack))
    lr_crit = float(np.quantile(boot_lr, 0.95))
    grid = prob.grid
    fine = np.linspace(grid[0], grid[-1], 4 * (grid.size - 1) + 1)
    n_k, s_k = binned.counts.sum(0), binned.succ.sum(0)
    _, _, prof_f = prob.hinge_at(n_k, s_k, fine, np.full(fine.size, ha0), np.zeros(fine.size))
    ci_lr = np.exp(_lr_interval(fine, 2 * (main["ll_hinge"] - prof_f), lr_crit, hc0))
    # Reported CI: the union of the two intervals. Each alone covers ~0.92–0.93 with 40
    # participants in simulation (benchmarks/bench_threshold_quality.py); the union ~0.94.
    ci = [float(min(ci_lr[0], ci_bca[0])), float(max(ci_lr[1], ci_bca[1]))]
    return {"percentile": ci_pct, "bca": ci_bca, "lr": ci_lr, "lr_crit": lr_crit, "ci": ci}


def pooled_verdict(p_exists: float, slope: float, aic: dict[str, float], bic: dict[str, float],
                   ci: list[float], grid_s: tuple[float, float], *, alpha: float = 0.05,
                   max_ci_decades: float = 1.0) -> tuple[ModelName, str | None]:
    """(model choice, reason no pooled onset is reported or None) for the secondary ψ*."""
    hinge_beats_smooth = aic["hinge"] < aic["smooth"] and bic["hinge"] < bic["smooth"]
    choice: ModelName
    if p_exists < alpha and slope > 0 and hinge_beats_smooth:
        choice = "hinge"
    elif bic["smooth"] < bic["flat"]:
        choice = "smooth"
    else:
        choice = "flat"
    at_edge = ci[0] <= grid_s[0] * (1 + 1e-9) or ci[1] >= grid_s[1] * (1 - 1e-9)
    if p_exists >= alpha:
        return choice, ("No threshold: no evidence that switching depends on the wait "
                        f"(p_exists = {p_exists:.3g} >= {alpha:g})")
    if slope <= 0:
        return choice, ("No threshold: switching does not rise above the best breakpoint "
                        "(slope <= 0)")
    if not hinge_beats_smooth:
        return choice, "No threshold: " + smooth_vs_hinge_text(aic, bic,
                                                              "ψ counted as a parameter")
    if math.log10(ci[1] / ci[0]) > max_ci_decades:
        return choice, (f"No threshold: the 95 % CI for ψ ({ci[0]:.3g}–{ci[1]:.3g} s) spans "
                        f"more than {max_ci_decades:g} decade")
    if at_edge:
        return choice, (f"No threshold: the 95 % CI for ψ ({ci[0]:.3g}–{ci[1]:.3g} s) reaches "
                        "the edge of the observed waits, so the data do not bound it")
    return choice, None


def fit_threshold(
    df: pd.DataFrame,
    n_boot: int = 200,
    n_null: int = 200,
    seed: int = 0,
    grid_size: int = 60,
    *,
    alpha: float = 0.05,
    wait_quantiles: tuple[float, float] = (0.05, 0.95),
    max_ci_decades: float = 1.0,
    max_bins: int = 256,
) -> ThresholdResult:
    """Fit the hinge-logistic flow threshold to cycles (`participant_id`, `wait_s` > 0,
    `switched` 0/1), with a participant-cluster bootstrap CI (`n_boot`), a parametric-bootstrap
    existence test (`n_null`) and AIC/BIC comparison with smooth and flat models.

    No tokens/s figure: what a model speed means for the person is
    `threshold_speed.exceedance_table`, from the personal threshold.
    Deterministic for a given `seed`.
    """
    _check_settings(n_boot, n_null, grid_size)
    logw, y, pid, n_part, dropped = _prepare(df)
    grid = _psi_grid(logw, y, n_part, wait_quantiles, grid_size)
    n_obs, n_sw = int(y.size), int(y.sum())
    binned = bin_cycles(logw, y, pid, n_part, max_bins)
    prob = PooledProblem(binned, grid)
    n_k, s_k = binned.counts.sum(0), binned.succ.sum(0)
    main = prob.fit(n_k, s_k)
    rng = np.random.default_rng(seed)
    lr, p_exists = existence_test(prob, binned, main, n_null, rng)
    boot_h, boot_s, boot_lr = cluster_bootstrap(prob, binned, main, n_boot, rng)
    cis = psi_intervals(prob, binned, main, boot_h, boot_lr, rng)
    ci = cis["ci"]
    ll = {"flat": main["ll_flat"], "smooth": main["ll_smooth"], "hinge": main["ll_hinge"]}
    aic, bic = _ic(ll, n_obs)
    ha, hb, hc = main["hinge"]
    psi = float(math.exp(hc))
    choice, reason = pooled_verdict(p_exists, hb, aic, bic, ci, (math.exp(grid[0]),
                                    math.exp(grid[-1])), alpha=alpha,
                                    max_ci_decades=max_ci_decades)
    found = reason is None
    ci_lr, ci_bca, ci_pct, lr_crit = cis["lr"], cis["bca"], cis["percentile"], cis["lr_crit"]

    return ThresholdResult(
        psi_s=psi,
        ci_s=ci,
        ci_lr_s=[float(v) for v in ci_lr],
        ci_bca_s=[float(v) for v in ci_bca],
        ci_percentile_s=[float(v) for v in ci_pct],
        ci_lr_crit=lr_crit,
        p_exists=p_exists,
        lr_stat=float(lr),
        model_choice=choice,
        found=found,
        reason=reason,
        aic=aic,
        bic=bic,
        loglik=ll,
        params={
            "flat": {"a": main["flat_a"]},
            "smooth": {"a": main["smooth"][0], "b": main["smooth"][1]},
            "hinge": {"a": ha, "b": hb, "log_psi": hc},
        },
        n_obs=n_obs,
        n_participants=n_part,
        n_switches=n_sw,
        dropped=dropped,
        grid_s=[float(v) for v in np.exp(grid)],
        profile_loglik=[float(v) for v in main["profile"]],
        n_boot=n_boot,
        n_null=n_null,
        seed=seed,
        alpha=alpha,
        exact=binned.exact,
        boot_hinge=boot_h,
        boot_smooth=boot_s,
        x_center=float(prob.xc),
    )
