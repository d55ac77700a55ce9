"""Checks first (docs/concepts/analysis.md#checks-first): sample-ratio mismatch, carry-over,
manipulation (its own module, `flowtrial.analysis.manipulation`), missing data.

Every check returns a small result object with `.ok` (nothing to worry about) and
`.to_dict()` (JSON-ready). Bad input raises `AnalysisInputError` with a one-line message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.randomization import SRM_ALPHA, SRMResult
from flowtrial.study.randomization import srm_check as _study_srm

from . import AnalysisInputError
from .manipulation import ManipulationResult, manipulation_check

__all__ = ["CarryoverResult", "ManipulationResult", "MissingDataResult", "carryover_check",
           "manipulation_check", "missing_data", "srm_check"]


def _require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise AnalysisInputError(f"{what}: expected a pandas DataFrame")
    for c in cols:
        if not isinstance(c, str):
            raise AnalysisInputError(
                f"{what}: column names must be strings, got {type(c).__name__}"
            )
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise AnalysisInputError(f"{what}: column(s) {', '.join(missing)} not found in the data")


def _clean(v: Any) -> Any:
    """NaN → None and numpy scalars → Python, for JSON."""
    if isinstance(v, float | np.floating):
        return None if math.isnan(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


# ------------------------------------------------------------------------------- SRM


def srm_check(
    observed: Mapping[str, int], planned: Mapping[str, float], alpha: float = SRM_ALPHA
) -> SRMResult:
    """Sample-ratio mismatch: χ² of observed arm counts vs planned proportions (weights are
    normalised); flagged when p < alpha (0.001). Counts in an arm that was never planned are
    a mismatch by themselves (flagged, p = 0). This validates the input; the check itself is
    `flowtrial.study.randomization.srm_check`."""
    if not planned:
        raise AnalysisInputError("srm_check: no planned arms given")
    if any((not math.isfinite(float(w))) or float(w) <= 0 for w in planned.values()):
        raise AnalysisInputError("srm_check: planned proportions must be positive numbers")
    if any(int(c) < 0 for c in observed.values()):
        raise AnalysisInputError("srm_check: observed counts must be >= 0")
    planned_s = {str(k): float(v) for k, v in planned.items()}
    observed_s = {str(k): int(v) for k, v in observed.items()}
    return _study_srm(observed_s, planned_s, alpha=alpha)


# ------------------------------------------------------------------------- carry-over


class _CheckResult:
    """A check's outcome: ``ok`` first, then every field (for results.json)."""

    @property
    def ok(self) -> bool:  # pragma: no cover - each check defines it
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}  # type: ignore[call-overload]


@dataclass
class CarryoverResult(_CheckResult):
    """Period × arm interaction (Wald F with participant-clustered covariance)."""

    f_stat: float
    df_num: int
    df_denom: int
    p_value: float
    alpha: float
    n: int
    n_participants: int
    outcome: str
    log_outcome: bool
    terms: list[str]

    @property
    def ok(self) -> bool:
        return not (self.p_value < self.alpha)


def _independent_columns(X: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]]:
    """Greedily keep columns that raise the rank (empty arm × period cells are dropped)."""
    keep: list[int] = []
    rank = 0
    for j in range(X.shape[1]):
        r = np.linalg.matrix_rank(X[:, [*keep, j]])
        if r > rank:
            keep.append(j)
            rank = r
    return X[:, keep], [names[j] for j in keep]


def carryover_check(
    df: pd.DataFrame,
    outcome: str = "task_time_s",
    arm: str = "arm",
    period: str = "period",
    participant: str = "participant_id",
    *,
    log_outcome: bool = True,
    alpha: float = 0.05,
) -> CarryoverResult:
    """Test for carry-over in a crossover: OLS of (log) outcome on arm, period and arm × period
    with participant-clustered SEs; joint Wald F test of the interaction terms, denominator
    df = participants − 1. `ok` unless p < alpha."""
    import statsmodels.api as sm
    from scipy import stats

    _require(df, [outcome, arm, period, participant], "carryover_check")
    y = pd.to_numeric(df[outcome], errors="coerce")
    d = df.assign(_y=y).dropna(subset=["_y", arm, period, participant])
    if log_outcome:
        if (d["_y"] <= 0).any():
            raise AnalysisInputError(
                f"carryover_check: {outcome!r} has values <= 0; use log_outcome=False"
            )
        d = d.assign(_y=np.log(d["_y"]))
    arms = sorted(d[arm].astype(str).unique())
    periods = sorted(d[period].astype(str).unique())
    n_part = int(d[participant].nunique())
    if len(arms) < 2 or len(periods) < 2:
        raise AnalysisInputError(
            f"carryover_check: need >= 2 arms and >= 2 periods (got {len(arms)} and {len(periods)})"
        )
    if n_part < 3:
        raise AnalysisInputError("carryover_check: need >= 3 participants for clustered SEs")
    a = d[arm].astype(str).to_numpy()
    p = d[period].astype(str).to_numpy()
    cols = [np.ones(len(d))]
    names = ["const"]
    for lv in arms[1:]:
        cols.append((a == lv).astype(float))
        names.append(f"arm[{lv}]")
    for lv in periods[1:]:
        cols.append((p == lv).astype(float))
        names.append(f"period[{lv}]")
    for la in arms[1:]:
        for lp in periods[1:]:
            cols.append(((a == la) & (p == lp)).astype(float))
            names.append(f"arm[{la}]:period[{lp}]")
    X, names = _independent_columns(np.column_stack(cols), names)
    inter = [j for j, nm in enumerate(names) if ":" in nm]
    if not inter:
        raise AnalysisInputError(
            "carryover_check: the period × arm interaction is not identifiable "
            "(each period has a single arm)"
        )
    if len(d) <= X.shape[1]:
        raise AnalysisInputError("carryover_check: too few rows for the interaction model")
    groups = pd.factorize(d[participant])[0]
    res = sm.OLS(d["_y"].to_numpy(float), X).fit(cov_type="cluster", cov_kwds={"groups": groups})
    beta = np.asarray(res.params)[inter]
    cov = np.asarray(res.cov_params())[np.ix_(inter, inter)]
    wald = float(beta @ np.linalg.pinv(cov) @ beta)
    q = len(inter)
    df_denom = max(n_part - 1, 1)
    f_stat = wald / q
    p_value = float(stats.f.sf(f_stat, q, df_denom))
    return CarryoverResult(
        f_stat=f_stat,
        df_num=q,
        df_denom=df_denom,
        p_value=p_value,
        alpha=alpha,
        n=len(d),
        n_participants=n_part,
        outcome=outcome,
        log_outcome=log_outcome,
        terms=[names[j] for j in inter],
    )


# ----------------------------------------------------------------------- missing data


@dataclass
class MissingDataResult(_CheckResult):
    """Missing-value rates per arm and column; χ² test of missingness vs arm per column."""

    by_arm: list[dict[str, Any]]
    by_column: list[dict[str, Any]]
    problems: list[str]
    max_rate: float
    alpha: float

    @property
    def ok(self) -> bool:
        return not self.problems


def missing_data(
    df: pd.DataFrame,
    arm: str = "arm",
    columns: Sequence[str] | None = None,
    *,
    max_rate: float = 0.20,
    alpha: float = 0.05,
    cluster: str | None = None,
) -> MissingDataResult:
    """Share of missing values per arm for each of `columns` (default: all but `arm`).
    Problems: a column missing in more than `max_rate` of rows overall, or missing at
    different rates across arms, tested per column and Holm-corrected across the columns
    (`p_holm` < alpha). Rows of one participant are not independent: with `cluster` (the
    participant column) the test is a cluster-robust Wald test of arm in a linear
    probability model of missingness; without it, the χ² test of independence."""
    from scipy import stats

    if not isinstance(arm, str):
        raise AnalysisInputError("missing_data: `arm` must be the name of the arm column")
    cols = (
        [c for c in df.columns if c != arm]
        if columns is None and isinstance(df, pd.DataFrame)
        else list(columns or [])
    )
    _require(df, [arm, *cols, *([cluster] if cluster else [])], "missing_data")
    if not cols:
        raise AnalysisInputError("missing_data: no columns to check")
    d = df[df[arm].notna()]
    if d.empty:
        raise AnalysisInputError("missing_data: no rows with an arm")
    arms = d[arm].astype(str)
    by_arm = []
    for name, g in d.groupby(arms, sort=True):
        by_arm.append(
            {
                "arm": name,
                "n": int(len(g)),
                "missing": {c: int(g[c].isna().sum()) for c in cols},
                "rate": {c: float(g[c].isna().mean()) for c in cols},
            }
        )
    by_column: list[dict[str, Any]] = []
    problems = []
    for c in cols:
        miss = d[c].isna()
        rate = float(miss.mean())
        p_value = None
        if arms.nunique() > 1 and 0 < miss.sum() < len(miss):
            if cluster:
                p_value = _clustered_missing_p(miss, arms, d[cluster])
            else:
                table = pd.crosstab(arms, miss).to_numpy()
                if table.shape[1] == 2:
                    p_value = float(stats.chi2_contingency(table, correction=False)[1])
        by_column.append({"column": c, "rate": rate, "p_differential": p_value})
        if rate > max_rate:
            problems.append(f"{c}: {rate:.0%} missing (> {max_rate:.0%})")
    tested = [r for r in by_column if r["p_differential"] is not None]
    for r, p_holm in zip(tested, _holm([r["p_differential"] for r in tested]), strict=True):
        r["p_holm"] = p_holm
        if p_holm < alpha:
            problems.append(f"{r['column']}: missing at different rates across arms "
                            f"(p = {r['p_differential']:.3g}, Holm-adjusted over "
                            f"{len(tested)} columns {p_holm:.3g})")
    return MissingDataResult(
        by_arm=by_arm, by_column=by_column, problems=problems, max_rate=max_rate, alpha=alpha
    )


def _holm(p: list[float]) -> list[float]:
    """Holm step-down adjusted p-values (same order as given)."""
    order = np.argsort(p)
    m = len(p)
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return [float(v) for v in adj]


def _clustered_missing_p(miss: pd.Series, arms: pd.Series, groups: pd.Series) -> float | None:
    """p of a participant-clustered Wald test (F, G − 1 denominator df) that missingness
    does not depend on the arm (linear probability model: no separation problems)."""
    import statsmodels.api as sm

    x = pd.get_dummies(arms, drop_first=True, dtype=float)
    x.insert(0, "const", 1.0)
    codes = pd.factorize(groups)[0]
    if codes.max() < 1:
        return None
    fit = sm.OLS(miss.astype(float).to_numpy(), x.to_numpy()).fit(
        cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    k = x.shape[1]
    test = fit.f_test(np.eye(k)[1:])
    p = float(np.asarray(test.pvalue).ravel()[0])
    return p if math.isfinite(p) else None
