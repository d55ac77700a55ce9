"""What a model speed means for the person (docs/concepts/analysis.md#flow-threshold).

Instead of one "threshold in tokens/s" (a pace that mostly echoed the assumed reading
speed), the share of the study's own answers whose idle wait would exceed the median
personal threshold ψ if the model started after a TTFT t₀ and streamed at r tokens/s:

    idle wait of answer j = t₀ + max(0, N_j / r − N_j / reading speed)

(`flowtrial.study.timeline.idle_wait_s`, the definition ψ is measured in). The share is
monotone in ψ (down) and in the reading speed (up), so its range over ψ's 95 % CI and a
range of reading speeds is reached at the corners: that range is printed with it.

For agent turns the wait also holds the intermediate calls and the tool time, which the
turn table does not split out; no single pace defines such a wait, so nothing is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from flowtrial.study.timeline import DEFAULT_READING_TPS, idle_wait_s

SPEEDS_TPS = (50.0, 75.0, 150.0, 1000.0, 3000.0)
TTFTS_S = (0.5, 2.0)
#: Reading speeds spanned around the study's own (Brysbaert 2019: 175–300 words/min
#: around 238).
READING_RANGE = (0.75, 1.25)


def share_exceeding(psi_s: float, tokens: np.ndarray, tps: float, ttft_s: float,
                    reading_tps: float) -> float:
    """Share of answers (``tokens`` each) whose idle wait at (``ttft_s``, ``tps``) > ψ."""
    waits = idle_wait_s(ttft_s, tokens, tps, reading_tps)
    return float(np.mean(waits > psi_s))


def exceedance_table(psi_s: float, psi_ci_s: Sequence[float] | None,
                     answer_tokens: Sequence[float] | np.ndarray,
                     *, found: bool, reading_tps: float = DEFAULT_READING_TPS,
                     wait_unit: str = "cycle", speeds: Sequence[float] = SPEEDS_TPS,
                     ttfts: Sequence[float] = TTFTS_S) -> dict[str, Any]:
    """Rows (tokens/s, TTFT, share of answers waiting longer than ψ, its range over ψ's CI
    and the reading-speed range), or ``rows: None`` with the reason it is not defined: only
    a threshold the verdict reports (``found``, with a CI) is translated into model speeds."""
    # A CSV column may hold blanks or text: those answers have no length.
    tok = pd.to_numeric(pd.Series(answer_tokens, dtype=object), errors="coerce").to_numpy(float)
    tok = tok[np.isfinite(tok) & (tok > 0)]
    base: dict[str, Any] = {"psi_s": psi_s, "reading_tps": reading_tps,
                            "reading_tps_range": [reading_tps * READING_RANGE[0],
                                                  reading_tps * READING_RANGE[1]],
                            "n_answers": int(tok.size), "rows": None, "reason": None}
    if wait_unit != "cycle":
        base["reason"] = ("not defined for agent turns: their waits hold intermediate calls "
                          "and tool time, which no single model pace sets")
        return base
    if tok.size == 0 or not found or not np.isfinite(psi_s) or psi_ci_s is None:
        base["reason"] = "no answer lengths recorded" if tok.size == 0 else "no threshold"
        return base
    lo_psi, hi_psi = float(psi_ci_s[0]), float(psi_ci_s[1])
    r_lo, r_hi = base["reading_tps_range"]
    rows = []
    for tps in speeds:
        for t0 in ttfts:
            rows.append({
                "tokens_per_second": float(tps), "ttft_s": float(t0),
                "share": share_exceeding(psi_s, tok, tps, t0, reading_tps),
                "share_range": [share_exceeding(hi_psi, tok, tps, t0, r_lo),
                                share_exceeding(lo_psi, tok, tps, t0, r_hi)],
            })
    base["rows"] = rows
    return base


def speed_lines(table: dict[str, Any]) -> list[str]:
    """The table as console lines (`flowtrial analyze` and `flowtrial threshold` print it
    alike): one per (tokens/s, TTFT), or why there are none."""
    if not table.get("rows"):
        return [f"model speed in tokens/s: {table.get('reason')}"]
    lines = []
    for row in table["rows"]:
        lo, hi = row["share_range"]
        lines.append(f"at {row['tokens_per_second']:g} tokens/s, TTFT {row['ttft_s']:g} s: "
                     f"{100 * row['share']:.0f} % of answers wait longer than ψ "
                     f"({100 * lo:.0f}–{100 * hi:.0f} %)")
    return lines


__all__ = ["SPEEDS_TPS", "TTFTS_S", "exceedance_table", "share_exceeding", "speed_lines"]
