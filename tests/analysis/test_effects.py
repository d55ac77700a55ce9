"""METR-style task-time effect: against direct statsmodels fits and (opt-in) METR's data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf

from flowtrial.analysis import AnalysisInputError
from flowtrial.analysis.effects import estimate_effect

Z = 1.959963984540054
TIME = "initial_implementation_time+post_review_implementation_time"


def make_metr_like(
    seed: int = 7, n_devs: int = 16, per_dev: int = 15, effect: float = 0.25
) -> pd.DataFrame:
    """A METR-shaped per-issue table with a known effect (time × (1 + effect) when treated),
    developer-level random intercepts, zero and missing post-review times."""
    rng = np.random.default_rng(seed)
    rows = []
    issue = 0
    for d in range(n_devs):
        dev_id = int(rng.integers(10, 999))
        dev_effect = rng.normal(0, 0.3)
        for _ in range(per_dev):
            issue += 1
            forecast = float(np.round(np.exp(rng.normal(np.log(90), 0.6)) / 5) * 5 + 5)
            t = int(rng.random() < 0.5)
            total = np.exp(
                0.2
                + 0.95 * np.log(forecast)
                + np.log1p(effect) * t
                + dev_effect
                + rng.normal(0, 0.6)
            )
            post = 0.0 if rng.random() < 0.4 else float(np.round(total * rng.uniform(0.05, 0.3)))
            initial = float(np.round(max(total - post, 1.0)))
            post_val = np.nan if rng.random() < 0.1 else post
            rows.append(
                {
                    "dev_id": dev_id + 1000 * d,
                    "issue_id": issue,
                    "predicted_time_no_ai": forecast,
                    "predicted_time_ai_allowed": forecast * 0.8,
                    "ai_treatment": float(t),
                    "initial_implementation_time": initial,
                    "post_review_implementation_time": post_val,
                }
            )
    return pd.DataFrame(rows)


def _statsmodels_reference(df: pd.DataFrame, impute: str, fe: bool = False) -> dict:
    d = df.copy()
    if impute == "arm_mean":
        means = d.groupby("ai_treatment")["post_review_implementation_time"].mean()
        miss = d["post_review_implementation_time"].isna()
        d.loc[miss, "post_review_implementation_time"] = d.loc[miss, "ai_treatment"].map(means)
    else:
        d = d.dropna(subset=["post_review_implementation_time"])
    d["ly"] = np.log(d["initial_implementation_time"] + d["post_review_implementation_time"])
    d["lf"] = np.log(d["predicted_time_no_ai"])
    formula = "ly ~ ai_treatment + lf" + (" + C(dev_id)" if fe else "")
    out = {"n": len(d)}
    for name, kw in [
        ("nonrobust", {}),
        ("hc3", {"cov_type": "HC3"}),
        ("cluster", {"cov_type": "cluster", "cov_kwds": {"groups": d["dev_id"]}}),
    ]:
        res = smf.ols(formula, d).fit(**kw)
        b, se = res.params["ai_treatment"], res.bse["ai_treatment"]
        out["estimate"] = np.expm1(b)
        out[name] = [np.expm1(b - Z * se), np.expm1(b + Z * se)]
    mixed = smf.mixedlm("ly ~ ai_treatment + lf", d, groups=d["dev_id"]).fit(reml=True)
    out["mixed"] = np.expm1(mixed.fe_params["ai_treatment"])
    return out


@pytest.fixture(scope="module")
def metr_like_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("metr") / "metr_like.csv"
    make_metr_like().to_csv(path, index=False)
    return path


@pytest.mark.parametrize("impute", ["arm_mean", "drop"])
def test_matches_direct_statsmodels_fit(metr_like_csv: Path, impute: str) -> None:
    df = pd.read_csv(metr_like_csv)
    assert df["post_review_implementation_time"].isna().sum() > 5
    res = estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id", impute=impute)  # type: ignore[arg-type]
    ref = _statsmodels_reference(df, impute)
    assert res.n == ref["n"]
    assert res.estimate == pytest.approx(ref["estimate"], rel=1e-9)
    for name in ("nonrobust", "hc3", "cluster"):
        assert res.ci[name] == pytest.approx(ref[name], rel=1e-9)
    assert res.mixed is not None and res.mixed["estimate"] == pytest.approx(ref["mixed"], rel=1e-6)
    missing = int(df["post_review_implementation_time"].isna().sum())
    assert (res.imputed, res.dropped) == ((missing, 0) if impute == "arm_mean" else (0, missing))
    d = res.to_dict()
    assert list(d)[:3] == ["estimate", "ci", "n"]
    assert list(d["ci"]) == ["cluster_cr2", "nonrobust", "hc3", "cluster"]


def test_participant_fixed_effects_match_statsmodels(metr_like_csv: Path) -> None:
    df = pd.read_csv(metr_like_csv)
    res = estimate_effect(
        df,
        TIME,
        "ai_treatment",
        "predicted_time_no_ai",
        "dev_id",
        impute="arm_mean",
        participant_fe=True,
        mixed=False,
    )
    ref = _statsmodels_reference(df, "arm_mean", fe=True)
    assert res.estimate == pytest.approx(ref["estimate"], rel=1e-9)
    for name in ("nonrobust", "hc3", "cluster"):
        assert res.ci[name] == pytest.approx(ref[name], rel=1e-8)
    assert res.mixed is None


def test_recovers_known_effect_and_list_time_columns() -> None:
    df = make_metr_like(seed=3, n_devs=30, per_dev=30, effect=0.25)
    res = estimate_effect(
        df,
        ["initial_implementation_time", "post_review_implementation_time"],
        "ai_treatment",
        "predicted_time_no_ai",
        "dev_id",
        impute="arm_mean",
    )
    assert res.ci["cluster"][0] < 0.25 < res.ci["cluster"][1]
    assert res.ci["nonrobust"][0] > 0  # 900 issues: a +25 % effect is clearly detected
    null = estimate_effect(
        make_metr_like(seed=4, n_devs=30, per_dev=30, effect=0.0),
        TIME,
        "ai_treatment",
        "predicted_time_no_ai",
        "dev_id",
    )
    assert abs(null.estimate) < 0.12  # about 3 SEs at this size


def test_no_forecast_no_cluster() -> None:
    df = make_metr_like().dropna()
    res = estimate_effect(df, "initial_implementation_time", "ai_treatment", None, None)
    ref = smf.ols("np.log(initial_implementation_time) ~ ai_treatment", df).fit()
    assert res.beta == pytest.approx(ref.params["ai_treatment"], rel=1e-9)
    assert res.ci["cluster"] is None and res.mixed is None and res.n_clusters is None


@pytest.mark.parametrize(
    ("mutate", "kwargs", "fragment"),
    [
        (lambda d: d.drop(columns=["dev_id"]), {}, "not found"),
        (lambda d: d.assign(predicted_time_no_ai=0.0), {}, "non-positive forecast"),
        (lambda d: d.assign(ai_treatment=2), {}, "must be 0/1"),
        (lambda d: d.assign(initial_implementation_time=-1.0), {}, "negative time"),
        (
            lambda d: d.assign(
                initial_implementation_time=0.0, post_review_implementation_time=0.0
            ),
            {},
            "total time <= 0",
        ),
        (lambda d: d.head(4), {}, "too few rows"),
        (lambda d: d.assign(ai_treatment=1.0), {}, "both arms"),
        (lambda d: d, {"impute": "median"}, "unknown impute"),
        (lambda d: d.assign(ai_treatment="yes"), {}, "non-numeric"),
    ],
)
def test_bad_input_raises_one_line_error(mutate, kwargs, fragment) -> None:  # noqa: ANN001
    df = mutate(make_metr_like().fillna({"post_review_implementation_time": 0.0}))
    with pytest.raises(AnalysisInputError) as err:
        estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id", **kwargs)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


# METR's per-issue CSV (github.com/METR/Measuring-Early-2025-AI-on-Exp-OSS-Devs) carries no
# license, so it is not redistributed here. Point FLOWTRIAL_METR_CSV at a local copy of
# data_complete.csv to run the reproduction.
METR_CSV = os.environ.get("FLOWTRIAL_METR_CSV")


@pytest.mark.skipif(not METR_CSV, reason="set FLOWTRIAL_METR_CSV to METR's data_complete.csv")
def test_reproduces_metr_published_effect() -> None:
    df = pd.read_csv(METR_CSV)  # type: ignore[arg-type]
    res = estimate_effect(
        df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id", impute="arm_mean"
    )
    assert res.n == 246
    # Published (README of the repository): 0.188; non-robust (0.013, 0.395),
    # HC3 (0.013, 0.394), clustered by developer (0.016, 0.39). The CSV version we checked
    # gives 0.191 / (0.015, 0.398) / (0.015, 0.398) / (0.019, 0.393): within 0.005.
    assert res.estimate == pytest.approx(0.188, abs=0.005)
    assert res.ci["nonrobust"] == pytest.approx([0.013, 0.395], abs=0.005)
    assert res.ci["hc3"] == pytest.approx([0.013, 0.394], abs=0.005)
    assert res.ci["cluster"] == pytest.approx([0.016, 0.39], abs=0.005)


def test_cr2_default_interval_is_small_cluster_correct() -> None:
    from scipy.stats import t as student_t

    df = make_metr_like(seed=5, n_devs=8, per_dev=10, effect=0.25).dropna()
    res = estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id")
    d = res.to_dict()
    assert d["default_se"] == "cluster_cr2" and res.n_clusters == 8
    # One observation per cluster: CR2 is exactly HC2 (statsmodels), with t(n - 1).
    single = df.assign(one=np.arange(len(df)))
    r1 = estimate_effect(single, TIME, "ai_treatment", "predicted_time_no_ai", "one",
                         mixed=False)
    ref = smf.ols("np.log(initial_implementation_time + post_review_implementation_time)"
                  " ~ ai_treatment + np.log(predicted_time_no_ai)", single).fit(cov_type="HC2")
    assert r1.se["cluster_cr2"] == pytest.approx(ref.bse["ai_treatment"], rel=1e-8)
    # Its t has Satterthwaite degrees of freedom: fewer than n − 1 (unequal leverage).
    assert r1.cr2_df is not None and 2 < r1.cr2_df < len(df) - 1
    q = student_t.ppf(0.975, r1.cr2_df)
    assert r1.ci["cluster_cr2"][1] == pytest.approx(np.expm1(r1.beta + q * r1.se["cluster_cr2"]))
    assert r1.to_dict()["cr2_df"] == r1.cr2_df
    # With 8 clusters the CR2/t interval is wider than the METR-parity sandwich/normal one.
    wide = res.ci["cluster_cr2"][1] - res.ci["cluster_cr2"][0]
    assert wide > res.ci["cluster"][1] - res.ci["cluster"][0]


def test_period_covariate_and_imputation_note() -> None:
    df = make_metr_like(seed=6, n_devs=12, per_dev=12, effect=0.2)
    df["period"] = np.arange(len(df)) % 3
    # A strong period effect that the model must absorb.
    df["initial_implementation_time"] *= np.exp(0.5 * df["period"])
    with_p = estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id",
                             impute="arm_mean", covariates=["period"])
    without = estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id",
                              impute="arm_mean")
    assert with_p.covariates == ["period"] and with_p.n == without.n
    assert with_p.se["nonrobust"] < without.se["nonrobust"]  # period variance explained
    assert with_p.imputed > 0 and "too small" in with_p.imputation_note
    assert with_p.to_dict()["imputation_note"] == with_p.imputation_note
    with pytest.raises(AnalysisInputError, match="not found"):
        estimate_effect(df, TIME, "ai_treatment", None, "dev_id", covariates=["nope"])


def _bm_df_by_hand(x: np.ndarray, groups: np.ndarray, j: int) -> float:
    """Bell–McCaffrey df written out with the full n × n matrices (the textbook form)."""
    n = len(x)
    m = np.linalg.inv(x.T @ x)
    h = x @ m @ x.T
    cols = []
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        w, v = np.linalg.eigh(np.eye(len(rows)) - h[np.ix_(rows, rows)])
        a = v @ np.diag(w ** -0.5) @ v.T
        q = np.zeros(n)
        q[rows] = a @ x[rows] @ m[:, j]
        cols.append(q)
    u = (np.eye(n) - h) @ np.column_stack(cols)
    gram = u.T @ u
    return float(np.trace(gram) ** 2 / np.sum(gram * gram))


def test_cr2_satterthwaite_df_known_values_and_textbook_form() -> None:
    from flowtrial.analysis.effects import _cr2

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(8), 5)
    ones = np.ones((40, 1))
    # A mean over equal clusters: exactly G − 1.
    assert _cr2(ones, rng.normal(size=40), groups, 0)[1] == pytest.approx(7.0)
    # A cluster-level treatment, 4 clusters each side: 2·(4 − 1), as Welch's test.
    x = np.column_stack([np.ones(40), (groups < 4).astype(float)])
    assert _cr2(x, rng.normal(size=40), groups, 1)[1] == pytest.approx(6.0)
    # Any design: the same as the n × n textbook form.
    df = make_metr_like(seed=2, n_devs=9, per_dev=7).dropna()
    codes = pd.factorize(df["dev_id"])[0]
    xm = np.column_stack([np.ones(len(df)), df["ai_treatment"], np.log(df["predicted_time_no_ai"])])
    assert _cr2(xm, rng.normal(size=len(df)), codes, 1)[1] == pytest.approx(
        _bm_df_by_hand(xm, codes, 1), rel=1e-9)


def test_cr2_satterthwaite_covers_where_t_g_minus_1_does_not() -> None:
    """Two big clusters with noisy treated tasks and ten tiny ones: t(G − 1) undercovers,
    the Satterthwaite t holds its level (400 replicates, bounded: ~1 s)."""
    from scipy.stats import t as student_t

    from flowtrial.analysis.effects import _cr2

    rng = np.random.default_rng(0)
    sizes = np.array([40, 30] + [2] * 10)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    n, reps = int(sizes.sum()), 400
    hit_bm = hit_g = 0
    for _ in range(reps):
        tr = (rng.random(n) < 0.5).astype(float)
        x = np.column_stack([np.ones(n), tr])
        y = 0.8 * rng.normal(size=len(sizes))[groups] + rng.normal(size=n) * (
            1 + 2 * tr * (groups < 2))
        b = np.linalg.lstsq(x, y, rcond=None)[0]
        se, dof = _cr2(x, y - x @ b, groups, 1)
        hit_bm += abs(b[1]) < student_t.ppf(0.975, dof) * se
        hit_g += abs(b[1]) < student_t.ppf(0.975, len(sizes) - 1) * se
    assert hit_bm / reps >= 0.92 and hit_g / reps <= 0.90


def test_arm_mean_imputation_uses_kept_rows_only() -> None:
    df = make_metr_like(seed=8, n_devs=10, per_dev=12)
    # Rows without a forecast are dropped by the regression: give them extreme post-review
    # times, which must not move the imputed means.
    lost = df.sample(frac=0.2, random_state=1).index
    df.loc[lost, "predicted_time_no_ai"] = np.nan
    df.loc[lost, "post_review_implementation_time"] = 1e5
    full = estimate_effect(df, TIME, "ai_treatment", "predicted_time_no_ai", "dev_id",
                           impute="arm_mean", mixed=False)
    kept = estimate_effect(df.drop(index=lost), TIME, "ai_treatment", "predicted_time_no_ai",
                           "dev_id", impute="arm_mean", mixed=False)
    assert full.imputed > 0 and full.beta == pytest.approx(kept.beta, rel=1e-12)
    assert full.n == kept.n and full.dropped == kept.dropped + len(lost)
