"""Parameters of simulated participants and the truth models of switching
(docs/concepts/simulated-participants.md).

Everything a simulated study depends on lives in :class:`SimParams`, with the literature
anchors of docs/concepts/simulated-participants.md as defaults. Durations are *real* seconds
(as a person experiences them); a study with ``time_scale`` > 1 compresses them when they are
acted out or recorded.

The truth models give P(context switch during a wait) as a function of the **idle wait** w
(docs/concepts/timeline.md: TTFT plus the time by which delivery lags behind the reader,
computed by the one shared function :func:`flowtrial.study.timeline.idle_wait_s` from the
experienced TTFT, the number of tokens and the achieved tokens/s, at the participant's own
reading speed) and the person's threshold ψᵢ:

``hinge``  logit p = a + b·max(0, log w − log ψᵢ)
           a = logit(p_low); b = (logit(p_high) − a) / log(m), so p = p_low for every
           w ≤ ψᵢ and p = p_high exactly at w = m·ψᵢ (m = ``hinge_multiple``, default 4).
           Beyond m·ψᵢ the formula keeps rising (it is the model the analysis fits, so no cap).
``smooth`` logit p = c + d·(log w − log ψᵢ), no breakpoint: the logistic through
           (ψᵢ/m, p_low) and (m·ψᵢ, p_high), i.e. c = (logit p_low + logit p_high)/2 and
           d = (logit p_high − logit p_low) / (2·log m). Over the waits a study covers it spans
           the same probabilities as the hinge, but bends nowhere.
``flat``   p = p_flat for every wait (the null: waiting does not matter).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.special import expit, logit

from .capability import SimModel

TruthModel = Literal["hinge", "smooth", "flat"]
TRUTH_MODELS: tuple[str, ...] = ("hinge", "smooth", "flat")

IDLE_WAIT_DEFINITION = (
    "study.timeline.idle_wait_s: experienced TTFT + max(0, n/achieved_tps - n/reading_tps) "
    "(all-at-once delivery: the experienced TTFT, which includes the hold), at the "
    "participant's own reading speed"
)


class LogNormal(BaseModel):
    """A log-normal duration or count: ``median`` and ``logsd`` (sd of its natural log)."""

    model_config = ConfigDict(extra="forbid")
    median: float = Field(gt=0)
    logsd: float = Field(default=0.5, ge=0)


class SimParams(BaseModel):
    """Behaviour of simulated participants. Defaults follow
    docs/concepts/simulated-participants.md."""

    model_config = ConfigDict(extra="forbid")

    truth: TruthModel = "hinge"
    # Reading speed: 5.3 tokens/s (238 words/min, Brysbaert 2019), log-sd 0.2 across people.
    reading_tps: float = Field(default=5.3, gt=0)
    reading_tps_logsd: float = Field(default=0.2, ge=0)
    # Population threshold ψ of idle wait (the hypothesis under test), log-sd across people.
    threshold_s: float = Field(default=8.0, gt=0)
    threshold_logsd: float = Field(default=0.35, ge=0)
    # P(switch) well below / well above ψ, and where the hinge reaches p_high (multiple of ψ).
    p_low: float = Field(default=0.03, gt=0, lt=1)
    p_high: float = Field(default=0.60, gt=0, lt=1)
    hinge_multiple: float = Field(default=4.0, gt=1)
    p_flat: float = Field(default=0.15, gt=0, lt=1)
    # Agent turns (`--agent-steps K`): how long each tool runs between a call and the next
    # (file reads, listings, searches: well under a second; a test run takes longer).
    tool_time: LogNormal = LogNormal(median=0.5, logsd=0.8)
    # Per-person baseline switch propensity: a random intercept u_i ~ N(0, sd) added to the
    # logit of every truth model (people differ in how readily they switch at any wait).
    switch_intercept_sd: float = Field(default=0.0, ge=0)
    # Where in the idle wait the switch happens: a uniform fraction in this range (the edges
    # are avoided so the focus change falls clearly inside t_request..t_last_sent).
    switch_at_fraction: tuple[float, float] = (0.05, 0.95)
    # After a switch: time away (window-switch baseline ~17 s, Meyer et al.; median 30 s).
    time_away: LogNormal = LogNormal(median=30.0, logsd=0.8)
    # Resumption cost on return: median 15 s at the median time away, growing as
    # (away / time_away.median) ** resumption_growth (Monk/Trafton 2008, Jackson et al. 2003).
    resumption: LogNormal = LogNormal(median=15.0, logsd=0.5)
    resumption_growth: float = Field(default=0.5, ge=0)
    # Where focus goes: category -> (weight, apps). Apps are not in the working-apps list.
    away_apps: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "browser": ["firefox", "google-chrome"],
            "chat": ["slack", "discord"],
            "mail": ["thunderbird", "outlook"],
        }
    )
    away_weights: dict[str, float] = Field(
        default_factory=lambda: {"browser": 0.5, "chat": 0.3, "mail": 0.2}
    )
    working_app: str = "code"  # where focus returns (must be a working app of the study)
    # Decisions: acceptance 0.3 on average (Copilot 27 %, Google 25-34 %), varying across
    # people as Beta with this concentration; a share of partial accepts; the rest rejects.
    acceptance: float = Field(default=0.3, gt=0, lt=1)
    acceptance_concentration: float = Field(default=20.0, gt=0)
    partial_accept: float = Field(default=0.1, ge=0, lt=1)
    # Response length (tokens): median 300 for chat, 30 for inline completions.
    response_tokens_chat: LogNormal = LogNormal(median=300.0, logsd=0.6)
    response_tokens_inline: LogNormal = LogNormal(median=30.0, logsd=0.6)
    prompt_tokens: LogNormal = LogNormal(median=600.0, logsd=0.7)
    # Human durations (s). Person medians vary with `person_logsd`; cycles vary with `logsd`.
    prompt_crafting: LogNormal = LogNormal(median=20.0, logsd=0.6)
    review_verify: LogNormal = LogNormal(median=15.0, logsd=0.6)  # after reading the answer
    person_logsd: float = Field(default=0.3, ge=0)
    own_coding: LogNormal = LogNormal(median=60.0, logsd=0.9)  # between cycles
    # Switches unrelated to the assistant, during own coding (noise the analysis must ignore).
    p_switch_while_coding: float = Field(default=0.1, ge=0, le=1)
    task_gap: LogNormal = LogNormal(median=120.0, logsd=0.5)  # break between tasks
    participant_stagger_s: float = Field(default=300.0, ge=0)  # start offsets in the session
    forecast_logsd: float = Field(default=0.4, ge=0)  # METR-style task-time forecast error
    # Proxy realism in virtual mode: TTFT overhead (exponential mean, ms) and tps shortfall.
    ttft_overhead_ms: float = Field(default=2.0, ge=0)
    tps_shortfall_sd: float = Field(default=0.01, ge=0)
    # Speed versus capability (capability.py): the models the arms serve, each with its own
    # speed and chance of a good answer; a task needs `steps_per_task` good answers and ends
    # (abandoned) when its prompts run out first. Empty: one model, fixed prompts per task.
    models: dict[str, SimModel] = Field(default_factory=dict)
    steps_per_task: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SimParams:
        if self.truth != "flat" and self.p_high <= self.p_low:
            raise ValueError("p_high must be greater than p_low")
        lo, hi = self.switch_at_fraction
        if not 0 <= lo <= hi <= 1:
            raise ValueError("switch_at_fraction must be 0 <= lo <= hi <= 1")
        if set(self.away_weights) - set(self.away_apps):
            raise ValueError("away_weights names a category that away_apps lacks")
        if self.acceptance + self.partial_accept >= 1:
            raise ValueError("acceptance + partial_accept must be < 1")
        return self

    # ------------------------------------------------------------------ truth model

    def hinge_coefficients(self) -> tuple[float, float]:
        """(a, b) of the hinge: logit p = a + b·max(0, log w − log ψ)."""
        a = float(logit(self.p_low))
        b = (float(logit(self.p_high)) - a) / math.log(self.hinge_multiple)
        return a, b

    def smooth_coefficients(self) -> tuple[float, float]:
        """(c, d) of the smooth model: logit p = c + d·(log w − log ψ)."""
        lo, hi = float(logit(self.p_low)), float(logit(self.p_high))
        return (lo + hi) / 2, (hi - lo) / (2 * math.log(self.hinge_multiple))

    def truth_summary(self) -> dict[str, Any]:
        """What the analysis is scored against (stored as the population ground truth)."""
        a, b = self.hinge_coefficients()
        c, d = self.smooth_coefficients()
        return {
            "truth_model": self.truth,
            "formula": {
                "hinge": "logit p = a + b*max(0, log w - log psi_i)",
                "smooth": "logit p = c + d*(log w - log psi_i)",
                "flat": "p = p_flat",
            }[self.truth],
            "threshold_s": self.threshold_s,
            "threshold_logsd": self.threshold_logsd,
            "hinge": {"a": a, "b": b, "p_high_at_multiple": self.hinge_multiple},
            "smooth": {"c": c, "d": d},
            "p_flat": self.p_flat,
            "has_threshold": self.truth == "hinge",
            "idle_wait": IDLE_WAIT_DEFINITION,
        }


def switch_probability(
    idle_wait: Any, threshold: Any, params: SimParams, truth: TruthModel | None = None,
    offset: Any = 0.0,
) -> np.ndarray:
    """P(switch during a wait) for idle wait(s) ``idle_wait`` (s), threshold(s) ψᵢ (s) and
    the person's random intercept(s) ``offset`` (logit scale)."""
    truth = truth or params.truth
    w = np.maximum(np.asarray(idle_wait, dtype=float), 1e-6)
    psi = np.asarray(threshold, dtype=float)
    u = np.asarray(offset, dtype=float)
    if truth == "hinge":
        a, b = params.hinge_coefficients()
        return expit(a + u + b * np.maximum(0.0, np.log(w) - np.log(psi)))
    if truth == "smooth":
        c, d = params.smooth_coefficients()
        return expit(c + u + d * (np.log(w) - np.log(psi)))
    if truth == "flat":
        return expit(float(logit(params.p_flat)) + u + 0.0 * w * psi)
    raise ValueError(f"unknown truth model {truth!r}: use hinge, smooth or flat")


def expected_switch_probability(
    idle_wait: Any, params: SimParams, truth: TruthModel | None = None, nodes: int = 40
) -> np.ndarray:
    """Population-averaged P(switch) at each wait: E over ψᵢ ~ LogNormal(ψ, threshold_logsd)
    and the random intercepts uᵢ ~ N(0, switch_intercept_sd).

    Gauss–Hermite quadrature over log ψᵢ and uᵢ; used to score analysis against its true
    estimand (multiply by the detection share for what the switch rule counts).
    """
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    psi_i = params.threshold_s * np.exp(params.threshold_logsd * z)
    waits = np.asarray(idle_wait, dtype=float)
    if params.switch_intercept_sd == 0:
        return switch_probability(waits[..., None], psi_i, params, truth) @ w
    zu, wu = np.polynomial.hermite_e.hermegauss(15)
    wu = wu / wu.sum()
    u = params.switch_intercept_sd * zu
    p = switch_probability(waits[..., None, None], psi_i[:, None], params, truth, u[None, :])
    return (p @ wu) @ w


def detection_share(params: SimParams, min_away_s: float) -> float:
    """Share of switches a rule needing ``min_away_s`` s away counts: P(time away >= it).

    (Time away is log-normal; AFK and the switch's position inside the wait do not shorten
    it in the simulator.)"""
    from scipy.stats import norm

    if min_away_s <= 0:
        return 1.0
    ta = params.time_away
    return float(norm.sf((math.log(min_away_s) - math.log(ta.median)) / max(ta.logsd, 1e-12)))
