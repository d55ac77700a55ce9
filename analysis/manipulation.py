"""The manipulation check (docs/concepts/manipulation.md): did every cycle get the latency
its arm targeted, and when it did not, whose fault was it?

It reads the **raw** cycle rows (the database's columns: applied, i.e. time-compressed,
targets and monotonic-ns timestamps) and the study's ``time_scale`` s, and states everything
in **real** units: durations × s, tokens/s ÷ s.

**A miss.** The proxy records per shaped cycle how late the answer reached the participant
against its schedule (``violation_ms``: the later of the first and the last text token, see
``docs/concepts/shaping.md``). In real time that is ``miss_ms = violation_ms × s``. A cycle
is a miss when ``miss_ms`` exceeds the tolerance ``precision_ms × s``: the proxy promises
its releases to ``precision_ms`` (5 ms, the proxy's own violation flag) in raw time, and a
study compressed s-fold can promise no better than s times that in real time.

**Whose fault.** The proxy cannot send a token before it arrived, and it records when the
upstream's first output (text or tool call) and last event arrived
(``t_upstream_first_output_ns``, else the first bytes ``t_upstream_first_ns``;
``t_upstream_last_ns``).
For a miss on the first token the due time is ``t_request + target TTFT``; for a miss on the
last token (or on an answer released whole) it is the send time minus the miss. When the
upstream's event arrived after that due time by at least half the miss, the **upstream** was
slower than the target; otherwise the upstream was on time and the **proxy/machine** was late
(the proxy records nothing that tells its own lateness from the machine's stalls — a busy CPU,
a paused VM, garbage collection — so the two are one class). Without the upstream's arrival
times the fault is **unknown**.

**The built-in model in the proxy's process** (``[upstream] kind = "mock"``, rows with
``upstream = "mock"``) shares the machine with the proxy: its output arriving late means the
machine held it up, unless its own configured speed (``model_speed``: TTFT ms and tokens/s,
raw) put it after the due time. So for those rows the upstream is at fault only when its own
schedule (``t_request`` + its TTFT, + (n − 1)/its tokens/s for the last token) was late by
at least half the miss; a later arrival than its schedule is the **proxy/machine**'s.

**Verdict.** Per arm: *flagged* (``problems``) when the upstream missed in more than
``max_violation_rate`` of the shaped cycles beyond chance (one-sided binomial test,
p < ``alpha``), or the delivered rate is off the target by more than ``tps_tolerance``:
the study's arm was not delivered as designed. Misses of the proxy/machine above that rate
are a *warning*: the upstream kept up; the participants' experienced waits (which the
analysis uses) include the misses. Per arm the upstream's own TTFT and rate are shown
beside the target: the proxy can only slow delivery down.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from . import AnalysisInputError

__all__ = ["PROXY_PRECISION_MS", "FAULTS", "ManipulationResult", "manipulation_check"]

#: The raw precision the proxy promises for its releases: its own violation flag
#: (``flowtrial.instrumentation.proxy.shaping.VIOLATION_TOLERANCE_MS``; a test keeps them equal).
PROXY_PRECISION_MS = 5.0
#: An arm with fewer shaped cycles gets a note: its miss rate is imprecise.
MIN_CYCLES = 20
FAULTS = ("upstream", "proxy/machine", "unknown")
_FAULT_KEYS = {"upstream": "upstream", "proxy/machine": "proxy_machine", "unknown": "unknown"}


@dataclass
class ManipulationResult:
    """Per arm: targeted, delivered and upstream TTFT and tokens/s (real units), misses beyond
    the time-scaled tolerance, and whose fault they were."""

    by_arm: list[dict[str, Any]]
    misses: dict[str, Any]
    problems: list[str]
    warnings: list[str]
    notes: list[str]
    time_scale: float
    precision_ms: float
    tolerance_ms: float
    tps_tolerance: float
    max_violation_rate: float
    alpha: float
    n_cycles: int
    n_shaped: int
    summary: str = field(default="")

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def status(self) -> str:
        """``flagged`` (the arms were not delivered as designed), ``warn`` or ``ok``."""
        return "flagged" if self.problems else "warn" if self.warnings else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, **asdict(self)}


def _num(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None


def _max(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.max(x)) if len(x) else None


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms / 1000:.2f} s" if abs(ms) >= 1000 else f"{ms:.0f} ms" if abs(ms) >= 10 \
        else f"{ms:.2g} ms"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _fmt_tps(tps: float | None) -> str:
    return "—" if tps is None else f"{tps:,.0f} tokens/s" if tps >= 10 else f"{tps:.2g} tokens/s"


def _cycle_frame(cycles: pd.DataFrame, s: float,
                 model_speed: tuple[float, float] | None = None) -> pd.DataFrame:
    """One row per cycle with a text timeline: the miss (real ms), its fault, and the
    upstream's own TTFT and rate (real)."""
    req = _num(cycles, "t_request_ns")
    first = _num(cycles, "t_first_sent_ns")
    last = _num(cycles, "t_last_sent_ns")
    # The upstream's first output (text or tool call); its first bytes where older rows
    # lack it (schema < 6). Messages and Responses upstreams send a structure event first.
    up_first = _num(cycles, "t_upstream_first_output_ns")
    up_first = np.where(np.isfinite(up_first), up_first, _num(cycles, "t_upstream_first_ns"))
    up_last = _num(cycles, "t_upstream_last_ns")
    ttft = _num(cycles, "target_ttft_ms")
    tps = _num(cycles, "target_tps")
    viol = _num(cycles, "violation_ms")  # raw ms, ≥ 0, recorded for every shaped cycle
    tokens = _num(cycles, "tokens_sent")
    shaped = np.isfinite(ttft) | np.isfinite(tps)
    if "target_delivery" in cycles.columns:
        whole_target = (cycles["target_delivery"].astype(object).fillna("")
                        .to_numpy(object) == "all_at_once")
        shaped |= whole_target
    else:
        whole_target = np.zeros(len(cycles), bool)
    if "shaped" in cycles.columns:
        shaped |= pd.to_numeric(cycles["shaped"], errors="coerce").fillna(0).to_numpy(bool)
    stream = (pd.to_numeric(cycles["stream"], errors="coerce").fillna(1).to_numpy(bool)
              if "stream" in cycles.columns else np.ones(len(cycles), bool))
    whole = whole_target | ~stream
    status_ok = (cycles["status"].astype(str).to_numpy() == "ok"
                 if "status" in cycles.columns else np.ones(len(cycles), bool))
    timeline = np.isfinite(first) & np.isfinite(req)

    # Which due time the miss was against, and when the upstream's matching event came.
    due_first = req + ttft * 1e6
    first_late_ms = (first - due_first) / 1e6
    on_first = ~whole & np.isfinite(first_late_ms) & (first_late_ms >= viol - 1e-3)
    due = np.where(on_first, due_first, np.where(whole, first, last) - viol * 1e6)
    arrival = np.where(on_first, up_first, up_last)
    up_late_ms = (arrival - due) / 1e6
    if model_speed is not None and "upstream" in cycles.columns:
        up_late_ms = _in_process_lateness(cycles, model_speed, req, tokens, on_first, due,
                                          up_late_ms)
    miss_ms = np.clip(viol, 0, None) * s
    fault = np.where(~np.isfinite(up_late_ms), "unknown",
                     np.where(up_late_ms * s >= 0.5 * miss_ms, "upstream", "proxy/machine"))

    span_up = (up_last - up_first) / 1e9
    span_sent = (last - first) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        up_tps = np.where((tokens > 1) & (span_up > 0), (tokens - 1) / span_up, np.nan) / s
        sent_tps = np.where((tokens > 1) & (span_sent > 0), (tokens - 1) / span_sent, np.nan)
    achieved = _num(cycles, "achieved_tps")
    achieved = np.where(np.isfinite(achieved), achieved, sent_tps) / s
    return pd.DataFrame({
        "arm": cycles["arm"].astype(str).to_numpy(object),
        "shaped": shaped & timeline & status_ok,
        "target_ttft_ms": ttft * s,
        "experienced_ttft_ms": (first - req) / 1e6 * s,
        "upstream_ttft_ms": (up_first - req) / 1e6 * s,
        "target_tps": tps / s,
        "achieved_tps": achieved,
        "upstream_tps": up_tps,
        "miss_ms": miss_ms,
        "fault": fault,
    })


def _arm_row(name: str, g: pd.DataFrame, n_all: int, tolerance_ms: float) -> dict[str, Any]:
    sh = g[g["shaped"]]
    missed = sh[sh["miss_ms"] > tolerance_ms]
    target_tps = _median(sh["target_tps"].to_numpy(float))
    row: dict[str, Any] = {
        "arm": name,
        "cycles": n_all,
        "shaped_cycles": int(len(sh)),
        "target_ttft_ms": _median(sh["target_ttft_ms"].to_numpy(float)),
        "experienced_ttft_ms": _median(sh["experienced_ttft_ms"].to_numpy(float)),
        "upstream_ttft_ms": _median(sh["upstream_ttft_ms"].to_numpy(float)),
        "target_tps": target_tps,
        "achieved_tps": _median(sh["achieved_tps"].to_numpy(float)) if target_tps else None,
        "upstream_tps": _median(sh["upstream_tps"].to_numpy(float)) if target_tps else None,
        "misses": int(len(missed)),
        "miss_rate": float(len(missed) / len(sh)) if len(sh) else None,
        "miss_ms_median": _median(missed["miss_ms"].to_numpy(float)),
        "miss_ms_max": _max(missed["miss_ms"].to_numpy(float)),
    }
    for f in FAULTS:
        row[f"misses_{_FAULT_KEYS[f]}"] = int((missed["fault"] == f).sum())
    return row


def _beyond_chance(k: int, n: int, rate: float, alpha: float) -> bool:
    """k of n above ``rate`` beyond chance: one-sided binomial test, p < alpha."""
    from scipy.stats import binomtest

    return k > rate * n and binomtest(k, n, rate, alternative="greater").pvalue < alpha


def _judge(row: dict[str, Any], missed: pd.DataFrame, s: float, tps_tolerance: float,
           max_rate: float, alpha: float) -> tuple[list[str], list[str], list[str]]:
    """(problems, warnings, notes) of one arm, as sentences; ``missed``: its missed cycles."""
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    arm, n = row["arm"], row["shaped_cycles"]
    if n == 0:
        return problems, warnings, [f"arm {arm}: no shaped cycle with a text timeline."]

    def size(fault: str) -> str:
        ms = missed.loc[missed["fault"] == fault, "miss_ms"].to_numpy(float)
        return f"their misses median {_fmt_ms(_median(ms))}, max {_fmt_ms(_max(ms))} (real)"

    tgt, up, got = row["target_tps"], row["upstream_tps"], row["achieved_tps"]
    slow_upstream = tgt is not None and up is not None and up < tgt * (1 - tps_tolerance)
    if slow_upstream:
        notes.append(f"arm {arm}: the upstream's own rate ({_fmt_tps(up)}, median) is below "
                     f"the target {_fmt_tps(tgt)}; the proxy can only slow delivery down, so "
                     "this arm was delivered at the upstream's pace.")
    k_up = row["misses_upstream"]
    if k_up and _beyond_chance(k_up, n, max_rate, alpha):
        problems.append(f"arm {arm}: the upstream was slower than the target in {k_up} of {n} "
                        f"shaped cycles ({_pct(k_up / n)}); {size('upstream')}.")
    if tgt and got is not None and abs(got / tgt - 1) > tps_tolerance:
        who = ("the upstream was slower" if slow_upstream else
               "the proxy paced it too fast" if got > tgt else
               "whose fault is unknown (the upstream's arrival times were not recorded)"
               if up is None else "the upstream kept up: the proxy/machine was late")
        problems.append(f"arm {arm}: delivered {_fmt_tps(got)} (median) against a target of "
                        f"{_fmt_tps(tgt)} ({got / tgt:.2f}×): {who}.")
    k_px = row["misses_proxy_machine"]
    if k_px and _beyond_chance(k_px, n, max_rate, alpha):
        why = (f" Under time_scale {s:g} every raw ms of scheduling delay is {s:g} real ms, "
               "so a busy machine shows here; at time_scale 1 check the proxy host's load."
               if s != 1 else " Check the proxy host's load (docs/operators/limits.md).")
        warnings.append(f"arm {arm}: the upstream was on time but the proxy/machine was late "
                        f"in {k_px} of {n} shaped cycles ({_pct(k_px / n)}); "
                        f"{size('proxy/machine')}.{why}")
    k_un = row["misses_unknown"]
    if k_un and _beyond_chance(k_un, n, max_rate, alpha):
        warnings.append(f"arm {arm}: {k_un} of {n} shaped cycles missed the target "
                        f"({size('unknown')}); "
                        "the upstream's arrival times were not recorded, so whose fault is "
                        "unknown.")
    if n < MIN_CYCLES:
        notes.append(f"arm {arm}: only {n} shaped cycle(s), too few for a precise miss rate "
                     f"({row['misses']} missed).")
    return problems, warnings, notes


def _in_process_lateness(cycles: pd.DataFrame, model_speed: tuple[float, float],
                         req: np.ndarray, tokens: np.ndarray, on_first: np.ndarray,
                         due: np.ndarray, up_late_ms: np.ndarray) -> np.ndarray:
    """For the built-in model's rows, its lateness by its own schedule (raw ms): what it
    would have been late had the machine not held it up."""
    ttft_ms, tps = model_speed
    inproc = cycles["upstream"].astype(object).to_numpy(object) == "mock"
    gap_ns = 0.0 if not math.isfinite(tps) or tps <= 0 else 1e9 / tps
    own_first = req + ttft_ms * 1e6
    own_last = own_first + np.clip(np.nan_to_num(tokens) - 1, 0, None) * gap_ns
    own_late_ms = (np.where(on_first, own_first, own_last) - due) / 1e6
    return np.where(inproc & np.isfinite(up_late_ms), own_late_ms, up_late_ms)


def manipulation_check(
    cycles: pd.DataFrame,
    *,
    time_scale: float = 1.0,
    model_speed: tuple[float, float] | None = None,
    precision_ms: float = PROXY_PRECISION_MS,
    tps_tolerance: float = 0.10,
    max_violation_rate: float = 0.05,
    alpha: float = 0.05,
) -> ManipulationResult:
    """The manipulation check on raw cycle rows (``flowtrial.analysis.metrics.read_frames``'
    ``cycles``: applied targets and monotonic-ns timestamps) of a study run with
    ``time_scale``; see the module docstring for the tolerance, the fault classes and the
    verdict. ``model_speed``: the built-in model's (TTFT ms, tokens/s) when it ran in the
    proxy's process. Raises ``AnalysisInputError`` without cycles or shaped cycles."""
    need = ["arm", "t_request_ns", "t_first_sent_ns", "t_last_sent_ns", "target_ttft_ms",
            "target_tps", "violation_ms"]
    if not isinstance(cycles, pd.DataFrame):
        raise AnalysisInputError("manipulation_check: expected a pandas DataFrame")
    missing = [c for c in need if c not in cycles.columns]
    if missing:
        raise AnalysisInputError(f"manipulation_check: column(s) {', '.join(missing)} not "
                                 "found (pass the raw cycles of read_frames)")
    s = float(time_scale)
    if not math.isfinite(s) or s <= 0:
        raise AnalysisInputError(f"manipulation_check: time_scale {time_scale} must be > 0")
    if cycles.empty:
        raise AnalysisInputError("manipulation_check: no cycles yet")
    d = _cycle_frame(cycles, s, model_speed)
    n_shaped = int(d["shaped"].sum())
    if n_shaped == 0:
        raise AnalysisInputError(
            f"no shaped cycles among {len(d)}: every arm passed answers through unshaped (or "
            "no completed cycle had text), so there is no target to check")
    tolerance_ms = precision_ms * s
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    for name, g in d.groupby("arm", sort=True):
        row = _arm_row(str(name), g, int(len(g)), tolerance_ms)
        missed_arm = g[g["shaped"] & (g["miss_ms"] > tolerance_ms)]
        p, w, n = _judge(row, missed_arm, s, tps_tolerance, max_violation_rate, alpha)
        rows.append(row)
        problems += p
        warnings += w
        notes += n
    sh = d[d["shaped"]]
    missed = sh[sh["miss_ms"] > tolerance_ms]
    misses = {
        "count": int(len(missed)),
        "rate": float(len(missed) / n_shaped),
        "miss_ms_median": _median(missed["miss_ms"].to_numpy(float)),
        "miss_ms_max": _max(missed["miss_ms"].to_numpy(float)),
        "by_fault": {_FAULT_KEYS[f]: int((missed["fault"] == f).sum()) for f in FAULTS},
    }
    result = ManipulationResult(
        by_arm=rows, misses=misses, problems=problems, warnings=warnings, notes=notes,
        time_scale=s, precision_ms=precision_ms, tolerance_ms=tolerance_ms,
        tps_tolerance=tps_tolerance, max_violation_rate=max_violation_rate, alpha=alpha,
        n_cycles=int(len(d)), n_shaped=n_shaped)
    result.summary = summary_sentence(result)
    return result


def summary_sentence(r: ManipulationResult) -> str:
    """One line for the console and the report: the verdict, the misses, whose fault."""
    m = r.misses
    scale = (f" = {r.precision_ms:g} ms raw × time_scale {r.time_scale:g}"
             if r.time_scale != 1 else "")
    head = {"flagged": "FLAGGED", "warn": "warning", "ok": "ok"}[r.status]
    if not m["count"]:
        return (f"Manipulation check {head}: no shaped cycle missed its target by more than "
                f"{_fmt_ms(r.tolerance_ms)}{scale} ({r.n_shaped} shaped cycles).")
    f = m["by_fault"]
    return (f"Manipulation check {head}: {m['count']} of {r.n_shaped} shaped cycles "
            f"({_pct(m['rate'])}) missed their target by more than {_fmt_ms(r.tolerance_ms)}"
            f"{scale} (misses median {_fmt_ms(m['miss_ms_median'])}, max "
            f"{_fmt_ms(m['miss_ms_max'])}, real); whose fault: upstream {f['upstream']}, "
            f"proxy/machine {f['proxy_machine']}, unknown {f['unknown']}.")
