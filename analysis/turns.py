"""The unit of waiting: the cycle, or the agent turn (docs/concepts/turns.md).

Where agents made multi-call turns, or clients sent side calls, each cycle is not a wait
the person had. :func:`waiting_units` then turns the cycles frame into one row per turn,
shaped like a cycle so the whole per-cycle analysis runs on it unchanged: the turn's id is
its final call's (decision events name that cycle), its request is the turn's first
request, its text timeline (first and last token, tokens, pace) the final answer's. So the
switch is looked for during the whole turn, the idle wait is the turn's (from the person's
prompt to the answer's text), and the resumption lag and review time run from the final
answer. Side calls are set aside, retries merged into their turn. A study with only
single-call turns and no side calls keeps its cycles as they are: the same numbers as
before turns existed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

__all__ = ["WaitUnit", "turn_segments", "waiting_units"]


@dataclass(frozen=True)
class WaitUnit:
    """Which unit the analysis waited on, and what it set aside."""

    unit: str  # "cycle" | "turn"
    units: int  # rows analysed
    cycles: int  # cycles read
    side_calls: int  # set aside
    retries: int  # merged into their turn
    multi_call_turns: int

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-able fields (for ``DataFrame.attrs``), the sentence included."""
        return {**asdict(self), "note": self.sentence()}

    def sentence(self) -> str:
        if self.unit == "cycle":
            return (f"Unit of waiting: the cycle ({self.units} cycles; no agent turn had more "
                    "than one model call and no side calls were seen).")
        return (f"Unit of waiting: the agent turn ({self.units} turns from {self.cycles} "
                f"cycles, {self.multi_call_turns} with several model calls); "
                f"{self.side_calls} side calls set aside, {self.retries} retries merged "
                "into their turns.")


def waiting_units(cycles: pd.DataFrame) -> tuple[pd.DataFrame, WaitUnit]:
    """The frame the per-cycle analysis should run on, and which unit that is."""
    n = len(cycles)
    if n == 0 or "request_kind" not in cycles.columns or "turn_id" not in cycles.columns:
        return cycles, WaitUnit("cycle", n, n, 0, 0, 0)
    kind = cycles["request_kind"].astype(object).fillna("human").to_numpy(object)
    side = kind == "side"
    id_col = "id" if "id" in cycles.columns else "cycle_id"
    turn = cycles["turn_id"].astype(object).to_numpy(object)
    turn = np.where(pd.isna(turn), cycles[id_col].astype(str).to_numpy(object), turn)
    main = cycles.loc[~side].assign(_turn=turn[~side])
    sizes = main.groupby("_turn", sort=False).size()
    multi = int((sizes > 1).sum())
    retries = int((kind[~side] == "retry").sum())
    if multi == 0 and not side.any():
        return cycles, WaitUnit("cycle", n, n, 0, retries, 0)
    # Everything on each row's wall clock, to compare calls of one turn.
    offset = (pd.to_numeric(main["wall_anchor_ns"]).astype("Int64")
              - pd.to_numeric(main["mono_anchor_ns"]).astype("Int64"))
    req_wall = pd.to_numeric(main["t_request_ns"]).astype("Int64") + offset
    last_wall = pd.to_numeric(main["t_last_sent_ns"]).astype("Int64") + offset
    main = main.assign(_req_wall=req_wall, _last_wall=last_wall, _offset=offset)
    start = main.groupby("_turn", sort=False)["_req_wall"].min()
    # The final answer: the call whose text ended last (else the last request).
    order = main.assign(_has=main["_last_wall"].notna()).sort_values(
        ["_turn", "_has", "_last_wall", "_req_wall"], na_position="first", kind="stable")
    final = order.groupby("_turn", sort=False).tail(1).set_index("_turn")
    out = final.copy()
    new_req = start.reindex(out.index) - out["_offset"]
    out["t_request_ns"] = new_req.astype("Int64")
    first = pd.to_numeric(out["t_first_sent_ns"]).astype("Int64")
    out["experienced_ttft_ms"] = ((first - out["t_request_ns"]).astype("Float64") / 1e6
                                  ).astype(float)
    out = out.drop(columns=["_req_wall", "_last_wall", "_offset", "_has"])
    out = out.sort_values(["participant_id", "t_request_ns"], kind="stable").reset_index(
        drop=True)
    return out, WaitUnit("turn", len(out), n, int(side.sum()), retries, multi)


def turn_segments(cycles: pd.DataFrame) -> pd.DataFrame:
    """Inside each multi-call turn: one ``model call`` segment per call (request → last
    token, else its end) and one ``tool`` segment from a call that asked for tools to the
    next request of the turn (wall-clock ``start``/``end``, the final call's ``cycle_id``
    and ``arm``): what the dashboard timeline draws inside a turn's wait bar."""
    cols = ["phase", "start", "end", "cycle_id", "arm"]
    need = {"turn_id", "request_kind", "t_request_ns", "t_last_sent_ns", "t_done_ns",
            "tool_calls", "mono_anchor_ns", "wall_anchor_ns"}
    if len(cycles) == 0 or not need <= set(cycles.columns):
        return pd.DataFrame(columns=cols)
    c = cycles[cycles["request_kind"].astype(object).fillna("human") != "side"]
    c = c[c["turn_id"].notna()]
    if len(c) == 0:
        return pd.DataFrame(columns=cols)
    off = (pd.to_numeric(c["wall_anchor_ns"]) - pd.to_numeric(c["mono_anchor_ns"])).astype(
        "Int64")
    end = pd.to_numeric(c["t_last_sent_ns"]).astype("Int64").fillna(
        pd.to_numeric(c["t_done_ns"]).astype("Int64"))
    id_col = "id" if "id" in c.columns else "cycle_id"
    d = pd.DataFrame({"turn": c["turn_id"].to_numpy(object),
                      "cycle_id": c[id_col].astype(str).to_numpy(object),
                      "arm": c["arm"].astype(str).to_numpy(object),
                      "start": (pd.to_numeric(c["t_request_ns"]).astype("Int64") + off
                                ).to_numpy(),
                      "end": (end + off).to_numpy(),
                      "tools": pd.to_numeric(c["tool_calls"]).fillna(0).to_numpy(int)})
    d = d[d.groupby("turn")["turn"].transform("size") > 1].sort_values(["turn", "start"])
    if len(d) == 0:
        return pd.DataFrame(columns=cols)
    final = d.groupby("turn")["cycle_id"].transform("last")
    nxt = d.groupby("turn")["start"].shift(-1)
    tool = d[(d["tools"] > 0) & nxt.notna()].assign(start=d["end"], end=nxt)
    calls = d.assign(phase="model call", cycle_id=final)
    tool = tool.assign(phase="tool", cycle_id=final[tool.index])
    out = pd.concat([calls, tool], ignore_index=True).dropna(subset=["start", "end"])
    for col in ("start", "end"):
        out[col] = pd.to_datetime(out[col].astype("int64"), unit="ns", utc=True)
    return out[cols]
