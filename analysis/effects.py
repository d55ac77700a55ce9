"""METR-style task-time effect (docs/concepts/analysis.md#task-time-effect).

OLS of log(total task time) on the arm indicator and log(forecast) (the participant's
pre-randomization estimate), optionally with participant fixed effects. The effect is
reported as exp(β) − 1 (relative change in task time, treatment vs control) with 95 % CIs
exp(β ± z·SE) − 1 from non-robust, HC3 and participant-clustered SEs, and a random-intercept
mixed model as a robustness row.

The default interval (`cluster_cr2`, with participants as clusters) uses the bias-reduced
CR2 (Bell–McCaffrey) cluster-robust variance with a t critical value on Satterthwaite
degrees of freedom (Bell and McCaffrey's, as R's clubSandwich computes them): with the 10–30
participants of a typical study the plain sandwich with a normal critical value undercovers,
and t(G − 1) still does when clusters are unequal or the treatment varies within few of
them. The METR-parity rows (non-robust, HC3, `cluster`) keep the normal critical value
z = Φ⁻¹(0.975) because that is METR's own: their published `regression.py` computes every
interval as β ± norm.ppf(0.975)·SE, so their numbers are reproduced exactly.
`covariates` adds categorical terms (e.g. the crossover period).

Arm-mean imputation (METR's policy) takes each arm's mean over the rows the regression
keeps (a row dropped for a missing forecast or cluster does not shape it). It is single
imputation: imputed times count as observed,
so every SE and CI is too small when anything was imputed (`imputation_note` says so).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from . import AnalysisInputError

ImputePolicy = Literal["drop", "arm_mean"]
SE_TYPES = ("cluster_cr2", "nonrobust", "hc3", "cluster")
DEFAULT_SE = "cluster_cr2"  # small-cluster-correct; the others are METR-parity rows
_Z95 = 1.959963984540054  # scipy.stats.norm.ppf(0.975)


@dataclass
class EffectResult:
    """Task-time effect: `estimate` = exp(β) − 1; `ci[se_type]` = [lo, hi] on that scale."""

    estimate: float
    ci: dict[str, list[float] | None]
    n: int
    beta: float
    se: dict[str, float | None]
    p: dict[str, float | None]
    mixed: dict[str, Any] | None
    imputed: int
    dropped: int
    n_clusters: int | None
    time_columns: list[str] = field(default_factory=list)
    participant_fe: bool = False
    covariates: list[str] = field(default_factory=list)
    cr2_df: float | None = None  # Satterthwaite (Bell–McCaffrey) df of the CR2 t interval

    @property
    def imputation_note(self) -> str | None:
        """Why the intervals are too narrow when values were imputed (None otherwise)."""
        if not self.imputed:
            return None
        return (f"{self.imputed} missing time value(s) were imputed by their arm's mean "
                "(METR's policy): single imputation treats them as observed, so the SEs, CIs "
                "and p-values are too small")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the first keys are exactly `estimate`, `ci`, `n`."""
        return {
            "estimate": self.estimate,
            "ci": {k: self.ci.get(k) for k in SE_TYPES},
            "n": self.n,
            "beta": self.beta,
            "se": {k: self.se.get(k) for k in SE_TYPES},
            "p": {k: self.p.get(k) for k in SE_TYPES},
            "mixed": self.mixed,
            "imputed": self.imputed,
            "dropped": self.dropped,
            "n_clusters": self.n_clusters,
            "time_columns": list(self.time_columns),
            "participant_fe": self.participant_fe,
            "covariates": list(self.covariates),
            "cr2_df": self.cr2_df,
            "default_se": DEFAULT_SE if self.ci.get(DEFAULT_SE) else None,
            "imputation_note": self.imputation_note,
        }


def _time_columns(df: pd.DataFrame, time: str | Sequence[str]) -> list[str]:
    """`time` may be a column, a list of columns, or "a+b" (columns summed)."""
    if isinstance(time, str):
        cols = [time] if time in df.columns else [c.strip() for c in time.split("+")]
    else:
        cols = list(time)
    if not cols or any(not c for c in cols):
        raise AnalysisInputError(f"bad --time {time!r}: give a column or columns joined by '+'")
    return cols


def _require_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        avail = ", ".join(map(str, df.columns[:20]))
        raise AnalysisInputError(
            f"column(s) {', '.join(map(repr, missing))} not found in the data "
            f"(available: {avail}); check the column names"
        )


def _numeric(df: pd.DataFrame, col: str) -> pd.Series:
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() & df[col].notna()
    if bad.any():
        example = df.loc[bad, col].iloc[0]
        raise AnalysisInputError(
            f"column {col!r} has {int(bad.sum())} non-numeric value(s) (e.g. {example!r}); "
            "clean or remove those rows"
        )
    return values.astype(float)


def _treatment(df: pd.DataFrame, col: str) -> pd.Series:
    values = df[col]
    if values.dtype == bool:
        values = values.astype(float)
    t = _numeric(df.assign(**{col: values}), col)
    bad = t.notna() & ~t.isin([0.0, 1.0])
    if bad.any():
        raise AnalysisInputError(
            f"treatment column {col!r} must be 0/1 but has values like {t[bad].iloc[0]:g}; "
            "recode it as 1 = treatment arm, 0 = control"
        )
    return t


@dataclass
class _Prepared:
    y: np.ndarray  # log total time
    t: np.ndarray  # 0/1
    log_forecast: np.ndarray | None
    groups: np.ndarray | None  # integer cluster codes
    imputed: int
    dropped: int
    extra: np.ndarray | None = None  # dummy columns of the categorical covariates


def _prepare(
    df: pd.DataFrame,
    time: str | Sequence[str],
    treatment: str,
    forecast: str | None,
    cluster: str | None,
    impute: str,
    continuous: bool = False,
) -> tuple[_Prepared, list[str]]:
    if not isinstance(df, pd.DataFrame):
        raise AnalysisInputError("expected a pandas DataFrame of tasks/issues")
    if impute not in ("drop", "arm_mean"):
        raise AnalysisInputError(f"unknown impute policy {impute!r}; use 'drop' or 'arm_mean'")
    time_cols = _time_columns(df, time)
    needed = [
        *time_cols,
        treatment,
        *([forecast] if forecast else []),
        *([cluster] if cluster else []),
    ]
    _require_columns(df, needed)

    t = _numeric(df, treatment) if continuous else _treatment(df, treatment)
    comps = pd.DataFrame({c: _numeric(df, c) for c in time_cols}, index=df.index)
    negative = (comps < 0).any(axis=1)
    if negative.any():
        raise AnalysisInputError(
            f"{int(negative.sum())} row(s) have a negative time in {', '.join(time_cols)}; "
            "times must be >= 0 (and their total > 0)"
        )
    keep = t.notna()
    fc = None
    if forecast:
        fc = _numeric(df, forecast)
        nonpos = fc.notna() & (fc <= 0)
        if nonpos.any():
            raise AnalysisInputError(
                f"{int(nonpos.sum())} row(s) have a non-positive forecast in {forecast!r}; "
                "forecasts must be > 0 because the model uses log(forecast)"
            )
        keep &= fc.notna()
    if cluster:
        keep &= df[cluster].notna()

    imputed = 0
    if impute == "arm_mean":
        # Impute each missing time component by the mean of that component in the same arm
        # (METR: missing post-review times get the arm's mean post-review time).
        for c in time_cols:
            miss = comps[c].isna() & keep
            if not miss.any():
                continue
            # Arms are the treatment's values: 0/1, or each arm's speed for a trend.
            for arm in np.unique(t[keep].dropna()):
                # The mean comes from rows that enter the regression: a row dropped for a
                # missing forecast or cluster must not shape the imputed values.
                obs = comps.loc[keep & (t == arm) & comps[c].notna(), c]
                arm_miss = miss & (t == arm)
                if arm_miss.any() and obs.empty:
                    raise AnalysisInputError(
                        f"cannot impute {c!r} by arm mean: arm {arm:g} has no observed "
                        "values; use --impute drop"
                    )
                comps.loc[arm_miss, c] = obs.mean()
            imputed += int(miss.sum())
    keep &= comps.notna().all(axis=1)

    total = comps.sum(axis=1)
    nonpos = keep & (total <= 0)
    if nonpos.any():
        raise AnalysisInputError(
            f"{int(nonpos.sum())} row(s) have a total time <= 0 in {'+'.join(time_cols)}; "
            "times must be > 0 because the model uses log(time)"
        )
    dropped = int((~keep).sum())
    sub_t = t[keep].to_numpy()
    n = int(keep.sum())
    if n == 0 or len(np.unique(sub_t)) < 2:
        raise AnalysisInputError(
            f"need rows in both arms of {treatment!r} (0 and 1, or two distinct values) after "
            "dropping missing values; "
            f"got {n} usable row(s)"
        )
    groups = None
    if cluster:
        groups = pd.factorize(df.loc[keep, cluster])[0]
    prepared = _Prepared(
        y=np.log(total[keep].to_numpy()),
        t=sub_t.astype(float),
        log_forecast=np.log(fc[keep].to_numpy()) if fc is not None else None,
        groups=groups,
        imputed=imputed,
        dropped=dropped,
    )
    return prepared, time_cols


def _design(prep: _Prepared, participant_fe: bool) -> np.ndarray:
    cols = [np.ones_like(prep.y), prep.t]
    if prep.log_forecast is not None:
        cols.append(prep.log_forecast)
    if prep.extra is not None:
        cols.extend(prep.extra.T)
    if participant_fe and prep.groups is not None:
        n_groups = int(prep.groups.max()) + 1
        # One dummy per participant except the first (absorbed by the constant).
        cols.extend((prep.groups == g).astype(float) for g in range(1, n_groups))
    return np.column_stack(cols)


def _cr2(x: np.ndarray, resid: np.ndarray, groups: np.ndarray, j: int = 1
         ) -> tuple[float, float]:
    """CR2 (Bell–McCaffrey 2002) cluster-robust SE of coefficient ``j`` and its
    Satterthwaite degrees of freedom.

    Each cluster's residuals are rescaled by A_g = (I − H_gg)^(−1/2) before the sandwich
    (pseudo-inverse root where a fixed effect makes I − H_gg singular). The degrees of
    freedom are Bell and McCaffrey's (clubSandwich's "Satterthwaite" under its working
    model Φ = I): with p_g = A_g X_g M e_j (M = (X'X)⁻¹) placed in cluster g's rows of a
    column q_g, and U = (I − H)[q_1 … q_G], df = tr(U'U)² / tr((U'U)²). It equals G − 1
    for a mean over equal clusters and falls below it when clusters or leverage are
    unequal, where t(G − 1) undercovers.
    """
    bread = np.linalg.pinv(x.T @ x)
    n = x.shape[0]
    labels = np.unique(groups)
    q = np.zeros((n, len(labels)))
    for k, g in enumerate(labels):
        rows = groups == g
        xg = x[rows]
        m = np.eye(int(rows.sum())) - xg @ bread @ xg.T
        w, v = np.linalg.eigh(0.5 * (m + m.T))
        inv_root = np.where(w > 1e-10, 1.0 / np.sqrt(np.clip(w, 1e-10, None)), 0.0)
        a_g = v @ (inv_root[:, None] * v.T)
        q[rows, k] = a_g @ (xg @ bread[:, j])
    var = float(np.sum((q.T @ resid) ** 2))
    u = q - x @ (bread @ (x.T @ q))  # (I − H) Q without forming the n × n hat matrix
    gram = u.T @ u
    denom = float(np.sum(gram * gram))
    dof = float(np.trace(gram) ** 2 / denom) if denom > 0 else float(len(labels) - 1)
    return float(np.sqrt(max(var, 0.0))), dof


def _row_t(beta: float, se: float, df: float) -> tuple[list[float], float]:
    from scipy.stats import t as student_t

    q = float(student_t.ppf(0.975, df))
    ci = [float(np.expm1(beta - q * se)), float(np.expm1(beta + q * se))]
    p = float(2 * student_t.sf(abs(beta / se), df)) if se > 0 else float("nan")
    return ci, p


def _row(beta: float, se: float) -> tuple[list[float], float]:
    from scipy.stats import norm

    ci = [float(np.expm1(beta - _Z95 * se)), float(np.expm1(beta + _Z95 * se))]
    p = float(2 * norm.sf(abs(beta / se))) if se > 0 else float("nan")
    return ci, p


def _mixed(prep: _Prepared) -> dict[str, Any]:
    """Random-intercept (per cluster) linear mixed model, REML; same fixed effects, no FE."""
    import statsmodels.api as sm

    exog = _design(prep, participant_fe=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = sm.MixedLM(prep.y, exog, groups=prep.groups).fit(reml=True)
        beta, se = float(res.fe_params[1]), float(res.bse_fe[1])
        if not np.isfinite(se):
            raise ValueError("non-finite standard error")
    except (ValueError, np.linalg.LinAlgError) as exc:
        return {
            "estimate": None,
            "ci": None,
            "beta": None,
            "se": None,
            "p": None,
            "converged": False,
            "error": str(exc).splitlines()[0],
        }
    ci, p = _row(beta, se)
    notes = sorted({str(w.message).splitlines()[0] for w in caught})
    return {
        "estimate": float(np.expm1(beta)),
        "ci": ci,
        "beta": beta,
        "se": se,
        "p": p,
        "converged": bool(getattr(res, "converged", True)),
        "group_var": float(np.asarray(res.cov_re).ravel()[0]),
        "warnings": notes,
    }


def estimate_effect(
    df: pd.DataFrame,
    time: str | list[str],
    treatment: str,
    forecast: str | None,
    cluster: str | None,
    impute: ImputePolicy = "drop",
    participant_fe: bool = False,
    mixed: bool = True,
    covariates: Sequence[str] | None = None,
    continuous: bool = False,
) -> EffectResult:
    """Estimate the relative effect of `treatment` (1 vs 0) on task time.

    With ``continuous`` the treatment is a number (e.g. log2 of an arm's expected wait) and
    the effect is exp(β) − 1 per unit of it: the trend over arms.

    `time`: column(s) summed into the total time (a list, or "a+b"). `forecast`: the
    pre-randomization time estimate (log-covariate) or None. `cluster`: participant column for
    cluster-robust SEs, participant FE and the mixed model. `impute`: "drop" rows with a
    missing time component, or "arm_mean" (fill it with that component's mean in its arm).
    Raises `AnalysisInputError` (a ValueError) with a one-line message on bad input.
    """
    import statsmodels.api as sm

    prep, time_cols = _prepare(df, time, treatment, forecast, cluster, impute, continuous)
    if covariates:
        prep = _with_covariates(prep, df, time, treatment, forecast, cluster, impute,
                                list(covariates), continuous)
    if participant_fe and cluster is None:
        raise AnalysisInputError(
            "participant fixed effects need --cluster (the participant column)"
        )
    exog = _design(prep, participant_fe)
    n, k = exog.shape
    if n < k + 2:
        raise AnalysisInputError(
            f"too few rows: {n} usable row(s) for {k} regression coefficients (need >= {k + 2})"
        )
    if np.linalg.matrix_rank(exog) < k:
        raise AnalysisInputError(
            "the regression design is singular (e.g. treatment constant within every "
            "participant while using participant fixed effects); drop --participant-fe"
        )
    n_clusters = int(prep.groups.max()) + 1 if prep.groups is not None else None
    if n_clusters is not None and n_clusters < 2:
        raise AnalysisInputError(f"cluster column {cluster!r} has a single cluster; need >= 2")

    model = sm.OLS(prep.y, exog)
    fits = {"nonrobust": model.fit(), "hc3": model.fit(cov_type="HC3")}
    if prep.groups is not None:
        fits["cluster"] = model.fit(cov_type="cluster", cov_kwds={"groups": prep.groups})
    beta = float(fits["nonrobust"].params[1])
    ci: dict[str, list[float] | None] = {k_: None for k_ in SE_TYPES}
    se: dict[str, float | None] = {k_: None for k_ in SE_TYPES}
    p: dict[str, float | None] = {k_: None for k_ in SE_TYPES}
    for name, res in fits.items():
        se_k = float(np.asarray(res.bse)[1])
        se[name] = se_k
        ci[name], p[name] = _row(beta, se_k)
    cr2_df = None
    if prep.groups is not None and n_clusters is not None:
        se_cr2, cr2_df = _cr2(exog, np.asarray(fits["nonrobust"].resid), prep.groups)
        se["cluster_cr2"] = se_cr2
        ci["cluster_cr2"], p["cluster_cr2"] = _row_t(beta, se_cr2, cr2_df)

    mixed_row = _mixed(prep) if (mixed and prep.groups is not None) else None
    return EffectResult(
        estimate=float(np.expm1(beta)),
        ci=ci,
        n=n,
        beta=beta,
        se=se,
        p=p,
        mixed=mixed_row,
        imputed=prep.imputed,
        dropped=prep.dropped,
        n_clusters=n_clusters,
        time_columns=time_cols,
        participant_fe=participant_fe,
        covariates=list(covariates or []),
        cr2_df=cr2_df,
    )


def _with_covariates(prep: _Prepared, df: pd.DataFrame, time: str | Sequence[str],
                     treatment: str, forecast: str | None, cluster: str | None, impute: str,
                     covariates: list[str], continuous: bool = False) -> _Prepared:
    """Add dummies (first level dropped) of categorical ``covariates``; rows missing one are
    dropped like any other missing value."""
    _require_columns(df, covariates)
    ok = df[covariates].notna().all(axis=1)
    if not ok.all():
        prep, _ = _prepare(df[ok], time, treatment, forecast, cluster, impute, continuous)
        prep.dropped += int((~ok).sum())
        df = df[ok]
    keep = _kept_rows(df, time, treatment, forecast, cluster, impute, continuous)
    dummies = pd.get_dummies(df.loc[keep, covariates].astype(str), drop_first=True)
    prep.extra = dummies.to_numpy(float) if dummies.shape[1] else None
    return prep


def _kept_rows(df: pd.DataFrame, time: str | Sequence[str], treatment: str,
               forecast: str | None, cluster: str | None, impute: str,
               continuous: bool = False) -> pd.Series:
    """The rows `_prepare` keeps (same rules), as a boolean mask on ``df``."""
    cols = _time_columns(df, time)
    comps = pd.DataFrame({c: _numeric(df, c) for c in cols}, index=df.index)
    keep = (_numeric(df, treatment) if continuous else _treatment(df, treatment)).notna()
    if forecast:
        keep &= _numeric(df, forecast).notna()
    if cluster:
        keep &= df[cluster].notna()
    if impute == "drop":
        keep &= comps.notna().all(axis=1)
    return keep
