"""Checks first (docs/concepts/analysis.md#checks-first): sample-ratio mismatch, carry-over,
manipulation, missing data.

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


# ----------------------------------------------------------------------- manipulation


@dataclass
class ManipulationResult(_CheckResult):
    """Per arm: targeted vs experienced TTFT and tokens/s, violation rate."""

    by_arm: list[dict[str, Any]]
    problems: list[str]
    ttft_tolerance_ms: float
    tps_tolerance: float
    max_violation_rate: float

    @property
    def ok(self) -> bool:
        return not self.problems


def _ms(df: pd.DataFrame, stem: str) -> pd.Series:
    """`<stem>_ms`, or `<stem>_s` × 1000 (the metrics layer's cycle table uses seconds)."""
    if f"{stem}_ms" in df.columns:
        return pd.to_numeric(df[f"{stem}_ms"], errors="coerce")
    if f"{stem}_s" in df.columns:
        return pd.to_numeric(df[f"{stem}_s"], errors="coerce") * 1000.0
    raise AnalysisInputError(f"manipulation_check: column {stem}_ms (or {stem}_s) not found")


def manipulation_check(
    cycles_df: pd.DataFrame,
    *,
    ttft_tolerance_ms: float = 100.0,
    tps_tolerance: float = 0.10,
    max_violation_rate: float = 0.05,
) -> ManipulationResult:
    """Per arm: median target and experienced TTFT, median and p95 |miss|, median target and
    achieved tokens/s, violation rate. A problem is reported when an arm's violation rate
    exceeds `max_violation_rate`, its median |TTFT miss| exceeds `ttft_tolerance_ms`, or its
    median achieved/target tokens/s is off by more than `tps_tolerance` (unshaped targets,
    i.e. NaN, are skipped)."""
    _require(cycles_df, ["arm", "target_tps", "achieved_tps", "violation"], "manipulation_check")
    if cycles_df.empty:
        raise AnalysisInputError("manipulation_check: no cycles")
    d = pd.DataFrame(
        {
            "arm": cycles_df["arm"].astype(str),
            "target": _ms(cycles_df, "target_ttft"),
            "experienced": _ms(cycles_df, "experienced_ttft"),
            "target_tps": pd.to_numeric(cycles_df["target_tps"], errors="coerce"),
            "achieved_tps": pd.to_numeric(cycles_df["achieved_tps"], errors="coerce"),
            "violation": pd.to_numeric(cycles_df["violation"].astype(float), errors="coerce"),
        }
    )
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for name, g in d.groupby("arm", sort=True):
        miss = (g["experienced"] - g["target"]).dropna()
        ratio = (g["achieved_tps"] / g["target_tps"]).replace([np.inf, -np.inf], np.nan).dropna()
        viol = g["violation"].dropna()
        row = {
            "arm": name,
            "n": int(len(g)),
            "target_ttft_ms_median": _clean(g["target"].median()),
            "experienced_ttft_ms_median": _clean(g["experienced"].median()),
            "ttft_miss_ms_median": _clean(miss.median()) if len(miss) else None,
            "ttft_abs_miss_ms_p95": _clean(miss.abs().quantile(0.95)) if len(miss) else None,
            "target_tps_median": _clean(g["target_tps"].median()),
            "achieved_tps_median": _clean(g["achieved_tps"].median()),
            "tps_ratio_median": _clean(ratio.median()) if len(ratio) else None,
            "violation_rate": _clean(viol.mean()) if len(viol) else None,
        }
        rows.append(row)
        if row["violation_rate"] is not None and row["violation_rate"] > max_violation_rate:
            problems.append(
                f"arm {name}: violation rate {row['violation_rate']:.1%} > {max_violation_rate:.0%}"
            )
        if len(miss) and abs(float(miss.median())) > ttft_tolerance_ms:
            problems.append(
                f"arm {name}: median TTFT miss {float(miss.median()):.0f} ms "
                f"(tolerance {ttft_tolerance_ms:g} ms)"
            )
        if len(ratio) and abs(float(ratio.median()) - 1) > tps_tolerance:
            problems.append(
                f"arm {name}: achieved tokens/s is {float(ratio.median()):.2f}× the target"
            )
    return ManipulationResult(
        by_arm=rows,
        problems=problems,
        ttft_tolerance_ms=ttft_tolerance_ms,
        tps_tolerance=tps_tolerance,
        max_violation_rate=max_violation_rate,
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
) -> MissingDataResult:
    """Share of missing values per arm for each of `columns` (default: all but `arm`).
    Problems: a column missing in more than `max_rate` of rows overall, or missing at
    different rates across arms (χ² test of independence, p < alpha)."""
    from scipy import stats

    if not isinstance(arm, str):
        raise AnalysisInputError("missing_data: `arm` must be the name of the arm column")
    cols = (
        [c for c in df.columns if c != arm]
        if columns is None and isinstance(df, pd.DataFrame)
        else list(columns or [])
    )
    _require(df, [arm, *cols], "missing_data")
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
    by_column = []
    problems = []
    for c in cols:
        miss = d[c].isna()
        rate = float(miss.mean())
        p_value = None
        if arms.nunique() > 1 and 0 < miss.sum() < len(miss):
            table = pd.crosstab(arms, miss).to_numpy()
            if table.shape[1] == 2:
                p_value = float(stats.chi2_contingency(table, correction=False)[1])
        by_column.append({"column": c, "rate": rate, "p_differential": p_value})
        if rate > max_rate:
            problems.append(f"{c}: {rate:.0%} missing (> {max_rate:.0%})")
        if p_value is not None and p_value < alpha:
            problems.append(f"{c}: missing at different rates across arms (p = {p_value:.3g})")
    return MissingDataResult(
        by_arm=by_arm, by_column=by_column, problems=problems, max_rate=max_rate, alpha=alpha
    )
