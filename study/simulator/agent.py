"""Simulated agent turns (``flowtrial simulate --agent-steps K``).

Each prompt of a simulated participant becomes an agent turn of K model calls: K − 1 calls
that answer with a tool call (a short generation at the arm's speed, then the tool runs),
then the final answer the chat simulation already models. The person waits for the whole
turn: the switch decision uses the turn's idle wait (everything before the final answer's
text, plus its delivery lag), and the ground truth (``cycle_truth``) is per turn. Tool times
come from their own random stream, so K = 1 leaves a simulation exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["AgentPlan", "TOOL_CALL_TOKENS", "add_agent_calls", "plan_agent_turns",
           "tool_run_times"]

TOOL_CALL_TOKENS = 24  # a tool call's arguments


@dataclass(frozen=True)
class AgentPlan:
    """Real-second offsets of each turn's earlier calls from the turn's start."""

    steps: int
    starts: np.ndarray  # (p, k, steps − 1): request time of each earlier call
    ends: np.ndarray  # (p, k, steps − 1): its end (the tool call's last token sent)
    prefix_s: np.ndarray  # (p, k): the final call's request time
    firsts: np.ndarray  # (p, k, steps − 1): the tool call's first token sent (after the TTFT)

    @property
    def tool_s(self) -> np.ndarray:
        """Tool time of each turn (between an earlier call's end and the next request)."""
        nxt = np.concatenate([self.starts[..., 1:], self.prefix_s[..., None]], axis=-1)
        return (nxt - self.ends).sum(axis=-1)


def tool_run_times(steps: int, shape: tuple[int, int], seed: int, median_s: float = 0.5,
                   logsd: float = 0.8) -> np.ndarray:
    """(p, k, K − 1) real seconds of each tool run: log-normal, from the seed's own stream
    (the virtual and the live simulator act out the same draws)."""
    rng = np.random.default_rng([seed, 0xA6E7])
    return np.exp(np.log(median_s) + logsd * rng.standard_normal((*shape, max(0, steps - 1))))


def plan_agent_turns(steps: int, ttft_s: np.ndarray, tps: np.ndarray, seed: int,
                     tool_median_s: float = 0.5, tool_logsd: float = 0.8) -> AgentPlan:
    """Lay out K − 1 tool-calling calls before each final answer (real seconds): each is held
    by the TTFT and its arguments paced as the proxy paces them (the first token at the
    TTFT, each next one 1/tps later); then the tool runs a log-normal time
    (``SimParams.tool_time``)."""
    p, k = np.shape(ttft_s)
    m = max(0, steps - 1)
    tool = tool_run_times(steps, (p, k), seed, tool_median_s, tool_logsd)
    pace = np.asarray(tps, dtype=float)
    gen = np.where(np.isfinite(pace) & (pace > 0), (TOOL_CALL_TOKENS - 1) / np.where(
        pace > 0, pace, 1.0), 0.0)
    ttft = np.asarray(ttft_s, dtype=float)[..., None]
    call = ttft + gen[..., None]  # each earlier call's duration
    per = call + tool
    starts = np.concatenate([np.zeros((p, k, min(m, 1))), np.cumsum(per, axis=-1)[..., :-1]],
                            axis=-1) if m else np.zeros((p, k, 0))
    ends = starts + call
    prefix = per.sum(axis=-1)
    return AgentPlan(steps, starts, ends, prefix, starts + ttft)


def add_agent_calls(cycles: pd.DataFrame, plan: AgentPlan, raw_ns: object) -> pd.DataFrame:
    """The cycles frame with each turn's earlier calls added (the final answers' rows are
    the chat rows, already shifted to the turn's last request); rows ordered by request."""
    if plan.steps <= 1:
        return cycles
    to_raw = raw_ns  # real seconds → raw ns (time_scale)
    p, k, m = plan.starts.shape
    final = cycles.reset_index(drop=True)
    turn_start = final["t_request_ns"].to_numpy(np.int64) - to_raw(  # type: ignore[operator]
        plan.prefix_s.reshape(-1))
    rows = []
    first_ids = final["id"].astype(str) + "-s1"
    for i in range(m):
        r = final.copy()
        r["id"] = final["id"].astype(str) + f"-s{i + 1}"
        start = turn_start + to_raw(plan.starts[..., i].reshape(-1))  # type: ignore[operator]
        end = turn_start + to_raw(plan.ends[..., i].reshape(-1))  # type: ignore[operator]
        first = turn_start + to_raw(plan.firsts[..., i].reshape(-1))  # type: ignore[operator]
        r["t_request_ns"] = start
        # The simulated model answers at once; the proxy holds and paces the call's
        # arguments, and records their timeline as a tool-only answer's (the proxy's own
        # record of such a call: docs/concepts/shaping.md).
        r["t_upstream_first_ns"] = start
        r["t_upstream_first_output_ns"] = start
        r["t_upstream_last_ns"] = start
        r["t_first_sent_ns"] = first
        r["t_last_sent_ns"] = end
        r["t_done_ns"] = end
        r["started_at"] = list(pd.to_datetime(final["wall_anchor_ns"].to_numpy(np.int64) + start,
                                              unit="ns", utc=True).to_pydatetime())
        r["experienced_ttft_ms"] = (first - start) / 1e6
        r["generation_wait_ms"] = (end - start) / 1e6
        span = (end - first) / 1e9
        with np.errstate(divide="ignore", invalid="ignore"):  # NaN (NULL): not paced
            r["achieved_tps"] = np.where(span > 0, (TOOL_CALL_TOKENS - 1) / span, np.nan)
        r["tokens_completion"] = TOOL_CALL_TOKENS
        r["tokens_sent"] = TOOL_CALL_TOKENS
        r["content_chars"] = 0
        r["tool_calls"] = 1
        r["violation"] = False
        r["violation_ms"] = 0.0
        r["request_kind"] = "human" if i == 0 else "continuation"
        rows.append(r)
    final = final.copy()
    final["request_kind"] = "continuation"
    out = pd.concat([*rows, final], ignore_index=True)
    out["turn_id"] = "trn_" + pd.concat([first_ids] * (m + 1), ignore_index=True)
    return out.sort_values(["participant_id", "t_request_ns"], kind="stable").reset_index(
        drop=True)
