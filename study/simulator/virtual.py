"""Virtual simulation: the behaviour model writes a study's tables without any HTTP.

Everything is computed as numpy arrays over (participants × cycles), so a study of 30
participants × 60 prompts takes a few tens of milliseconds in memory
(:func:`simulate_virtual_frames`, what power analysis uses) and well under a second in the
database (:func:`simulate_virtual`, which writes those frames with executemany).

Times follow the cycle timeline (docs/concepts/timeline.md) on a virtual clock:
``mono_anchor_ns`` = 0, ``wall_anchor_ns`` = :data:`VIRTUAL_EPOCH_NS`, ``t_*_ns`` in virtual ns
since that anchor. Like the proxy, everything is recorded *raw*: with ``study.time_scale`` = S
every duration is the real one divided by S (tokens/s multiplied by S); analysis multiplies
back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ..config import StudyConfig
from ..schema import Cycle, DrawCounter, Event, GroundTruth, Task, Turn
from ..storage import Database, WriteBatch, write_rows
from ..timeline import idle_wait_s
from ..turns import turn_rows_from_cycles
from .agent import add_agent_calls, plan_agent_turns
from .model import (
    Behaviour,
    Population,
    cycle_timeline,
    decide,
    draw_behaviour,
    draw_population,
    resumption_s,
    rng_streams,
    task_forecasts,
)
from .params import SimParams
from .records import (
    ProgressFn,
    SimulationResult,
    enroll_simulated,
    frame_rows,
    ground_truth_rows,
    keep_open,
    new_seed,
    next_participant_index,
    participant_ids,
)
from .targets import Targets, experienced_latency, study_targets

# 2026-01-05T09:00:00Z: a Monday morning; virtual studies start here.
VIRTUAL_EPOCH_NS = 1_767_603_600 * 10**9
CHARS_PER_TOKEN = 4
SIM_MODEL = "flowtrial-sim"
WORKING_CATEGORY = "editor"

CYCLE_COLUMNS = [c.name for c in Cycle.__table__.columns]  # type: ignore[attr-defined]
EVENT_COLUMNS = [c.name for c in Event.__table__.columns]  # type: ignore[attr-defined]
TASK_COLUMNS = [c.name for c in Task.__table__.columns]  # type: ignore[attr-defined]
TRUTH_COLUMNS = [c.name for c in GroundTruth.__table__.columns]  # type: ignore[attr-defined]


def _periods(values: np.ndarray) -> Any:
    """Periods as nullable integers: missing (<NA>) where the simulator marks none (< 0)."""
    out = pd.array(values, dtype="Int64")
    out[values < 0] = pd.NA
    return out


def _away_apps(params: SimParams, beh: Behaviour, cat: np.ndarray, app: np.ndarray
               ) -> tuple[list[str], list[str]]:
    cats = [beh.categories[int(c)] for c in cat]
    apps = [params.away_apps[c][int(a) % len(params.away_apps[c])] for c, a in zip(
        cats, app, strict=True)]
    return cats, apps


def _payloads(apps: list[str], cats: list[str]) -> list[str]:
    return [json.dumps({"app": a, "category": c}) for a, c in zip(apps, cats, strict=True)]


def _to_datetimes(wall_ns: np.ndarray) -> list[Any]:
    return list(pd.to_datetime(wall_ns, unit="ns", utc=True).to_pydatetime())


def simulate_virtual_frames(
    config: StudyConfig,
    params: SimParams,
    n_participants: int,
    tasks: int = 4,
    prompts_per_task: int = 15,
    seed: int | None = None,
    *,
    ids: list[str] | None = None,
    first_index: int = 0,
    first_task_id: int = 1,
    design_seed: int | None = None,
    protocol: str = "chat",
    agent_steps: int = 1,
) -> dict[str, pd.DataFrame]:
    """Simulate a study in memory: DataFrames with the columns of the study tables.

    Returns ``participants`` (id, enrolled_index, simulated), ``cycles``, ``events``,
    ``tasks`` and ``ground_truth`` (same columns as the tables; ``events.id`` is left
    empty) plus ``cycle_truth``: per cycle the real idle wait, ψᵢ, P(switch) and whether the
    participant switched (what the analysis should recover; not stored in the database).
    """
    if n_participants < 1 or tasks < 1 or prompts_per_task < 1:
        raise ValueError("need at least one participant, task and prompt per task")
    seed = new_seed() if seed is None else seed
    ids = ids or participant_ids(n_participants, first_index)
    rng_pop, rng_beh, rng_noise = rng_streams(seed)
    pop = draw_population(params, ids, rng_pop)
    beh = draw_behaviour(params, pop, tasks, prompts_per_task, rng_beh, protocol)
    targets = study_targets(config, ids, first_index, tasks, prompts_per_task, design_seed)
    exp = experienced_latency(config, targets, beh.n_tokens, params, rng_noise)
    s = config.study.time_scale
    p, k = len(ids), beh.n_cycles

    # Behaviour runs on real seconds (what a person experiences).
    ttft_real = exp.ttft_raw_s * s
    tps_real = exp.tps_raw / s
    all_at_once = targets.delivery == "all_at_once"
    r = pop.reading_tps[:, None]
    # Agent turns (agent.py): the final answer is requested `lead` real s into the turn, and
    # the person waits for all of it.
    plan = (plan_agent_turns(agent_steps, ttft_real, tps_real, seed, params.tool_time.median,
                             params.tool_time.logsd) if agent_steps > 1
            else None)
    lead = plan.prefix_s if plan is not None else 0.0
    # The analysis's own definition, from what was experienced (all-at-once: NaN pace, the
    # hold is inside the experienced TTFT).
    idle = idle_wait_s(ttft_real + lead, beh.n_tokens, tps_real, r)
    tl = cycle_timeline(
        params, ttft_s=ttft_real + lead, tps=tps_real, n_tokens=beh.n_tokens, idle_s=idle,
        reading_tps=r, threshold_s=pop.threshold_s[:, None], u_switch=beh.u_switch,
        switch_frac=beh.switch_frac, away_s=beh.away_s, resume_z=beh.resume_z,
        verify_s=beh.verify_s, all_at_once=all_at_once,
        switch_offset=None if pop.switch_offset is None else pop.switch_offset[:, None],
    )
    bg_resume = resumption_s(params, beh.bg_away_s, beh.bg_resume_z)
    post = beh.coding_s + np.where(beh.bg_switch, beh.bg_away_s + bg_resume, 0.0)
    task_of = np.arange(k) // prompts_per_task
    first_of_task = np.arange(k) % prompts_per_task == 0
    pre = beh.craft_s + np.where(first_of_task, beh.gap_s[:, task_of], 0.0)
    span = pre + tl["decision_at"] + post  # one cycle, from end of the previous one
    start = (first_index + np.arange(p))[:, None] * params.participant_stagger_s
    t_req = start + np.cumsum(span, axis=1) - tl["decision_at"] - post  # real s

    def raw_ns(real_s: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(real_s) / s * 1e9).astype(np.int64)

    req_ns = raw_ns(t_req + lead)  # the (final) call's request
    first_ns = req_ns + np.rint(exp.ttft_raw_s * 1e9).astype(np.int64)
    last_ns = req_ns + np.rint(exp.gen_wait_raw_s * 1e9).astype(np.int64)
    done_ns = last_ns + 1_000_000  # the record is made durable, then the stream closes
    flat = lambda a: np.asarray(a).reshape(-1)  # noqa: E731 - tiny local helper
    pid = np.repeat(np.array(ids, dtype=object), k)
    cycle_ids = np.array([f"{q}-c{j + 1:04d}" for q in ids for j in range(k)], dtype=object)
    task_ids = first_task_id + np.arange(p)[:, None] * tasks + task_of[None, :]
    tps_raw = flat(exp.tps_raw)
    cycles = pd.DataFrame({
        "id": cycle_ids,
        "participant_id": pid,
        "arm": flat(targets.arm),
        "task_id": flat(task_ids),
        "period": _periods(flat(targets.period)),
        "protocol": protocol,
        "transport": "http",
        "stream": True,
        "turn": flat(np.broadcast_to(np.arange(k) % prompts_per_task + 1, (p, k))),
        "connection_id": None,
        "model": SIM_MODEL,
        "upstream": "mock",
        "upstream_response_id": None,
        "mono_anchor_ns": 0,
        "wall_anchor_ns": VIRTUAL_EPOCH_NS,
        "t_request_ns": flat(req_ns),
        "t_upstream_first_ns": flat(req_ns + np.rint(exp.upstream_first_raw_s * 1e9)
                                    .astype(np.int64)),
        "t_upstream_last_ns": flat(req_ns + np.rint(exp.upstream_last_raw_s * 1e9)
                                   .astype(np.int64)),
        # The simulated model's first event is its first text.
        "t_upstream_first_output_ns": flat(req_ns + np.rint(exp.upstream_first_raw_s * 1e9)
                                           .astype(np.int64)),
        "t_first_sent_ns": flat(first_ns),
        "t_last_sent_ns": flat(last_ns),
        "t_done_ns": flat(done_ns),
        "started_at": _to_datetimes(VIRTUAL_EPOCH_NS + flat(req_ns)),
        "shaped": flat(targets.shaped),
        # Targets as the proxy applies them: raw (compressed by time_scale) like every time.
        "target_ttft_ms": flat(targets.ttft_ms) / s,
        "target_tps": flat(targets.tps) * s,
        "target_jitter": flat(targets.jitter),
        "target_delivery": flat(targets.delivery),
        "draw_json": flat(targets.draw_json),
        "experienced_ttft_ms": flat(exp.ttft_raw_s) * 1000.0,
        "generation_wait_ms": flat(exp.gen_wait_raw_s) * 1000.0,
        "achieved_tps": tps_raw,
        "violation": flat(exp.violation),
        "violation_ms": flat(exp.violation_ms),
        "tokens_prompt": flat(beh.prompt_tokens),
        "tokens_completion": flat(beh.n_tokens),
        "tokens_sent": flat(beh.n_tokens),
        "usage_exact": True,
        "tool_calls": 0,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "prompt_fingerprint": None,
        "content_fingerprint": None,
        "prompt_text": None,
        "content_text": None,
        "content_chars": flat(beh.n_tokens) * CHARS_PER_TOKEN,
        "simulated": True,
        "recorded_by": "simulator",
        # Chat cycles: each the person's own prompt, a single-call turn.
        "request_kind": "human",
        "kind_rule": "simulated",
        "turn_id": ["trn_" + c for c in cycle_ids],
        "conversation_key": None,
        "client": "flowtrial-simulator",
        "client_sdk": None,
        "input_key": None,
        "offers_tools": None,
        "revised_from": None,
        # No proxy wrote these answers: no delivery granularity to record.
        "frame_ms": None,
    })[CYCLE_COLUMNS]
    if plan is not None:
        cycles = add_agent_calls(cycles, plan, raw_ns)[CYCLE_COLUMNS]

    events = _events(params, beh, pop, tl, t_req, post, bg_resume, raw_ns, cycle_ids, ids,
                     task_ids, first_of_task, s)
    tasks_df = _tasks(params, beh, pop, targets, ids, task_ids, t_req, tl, post, raw_ns, s,
                      first_of_task)
    truth = _ground_truth(config, params, pop, seed, n_tasks=tasks,
                          prompts_per_task=prompts_per_task,
                          **({"agent_steps": agent_steps} if plan is not None else {}))
    cycle_truth = pd.DataFrame({
        "cycle_id": cycle_ids,
        "participant_id": pid,
        "idle_wait_s": flat(idle),
        "ttft_s": flat(ttft_real),
        "threshold_s": flat(np.broadcast_to(pop.threshold_s[:, None], (p, k))),
        "p_switch": flat(tl["p_switch"]),
        "switched": flat(tl["switched"]),
        "time_away_s": np.where(flat(tl["switched"]), flat(beh.away_s), np.nan),
    })
    if plan is not None:  # ground truth per turn: its calls and tool time
        cycle_truth["turn_calls"] = agent_steps
        cycle_truth["tool_s"] = flat(plan.tool_s)
    participants = pd.DataFrame({
        "id": ids, "enrolled_index": first_index + np.arange(p), "simulated": True,
    })
    return {"participants": participants, "cycles": cycles, "events": events,
            "tasks": tasks_df, "ground_truth": truth, "cycle_truth": cycle_truth}


def _events(params: SimParams, beh: Behaviour, pop: Population, tl: dict[str, np.ndarray],
            t_req: np.ndarray, post: np.ndarray, bg_resume: np.ndarray,
            raw_ns: Callable[[np.ndarray], np.ndarray], cycle_ids: np.ndarray, ids: list[str],
            task_ids: np.ndarray, first_of_task: np.ndarray, s: float) -> pd.DataFrame:
    p, k = t_req.shape
    pid = np.repeat(np.array(ids, dtype=object), k)
    cid = cycle_ids
    flat = lambda a: np.asarray(a).reshape(-1)  # noqa: E731
    parts: list[pd.DataFrame] = []

    def add(mask: np.ndarray, kind: Any, t_real: np.ndarray, cycle: Any, duration: Any,
            payload: Any) -> None:
        m = flat(mask)
        if not m.any():
            return
        parts.append(pd.DataFrame({
            "participant_id": pid[m], "cycle_id": cycle[m] if cycle is not None else None,
            "kind": kind[m] if isinstance(kind, np.ndarray) else kind,
            "ts_ns": VIRTUAL_EPOCH_NS + flat(raw_ns(t_real))[m],
            "duration_s": flat(duration)[m] / s if duration is not None else np.nan,
            "payload_json": payload,
        }))

    sw = tl["switched"]
    cats, apps = _away_apps(params, beh, flat(beh.away_cat)[flat(sw)],
                            flat(beh.away_app)[flat(sw)])
    back = json.dumps({"app": params.working_app, "category": WORKING_CATEGORY})
    add(sw, "focus_out", t_req + tl["switch_at"], cid, beh.away_s, _payloads(apps, cats))
    add(sw, "focus_in", t_req + tl["back_at"], cid, None, back)
    kinds = decide(beh.u_decision, pop.acceptance[:, None], pop.partial_accept[:, None])
    accepted = np.rint(beh.partial_frac * beh.n_tokens).astype(np.int64)
    payload = [
        json.dumps({"accepted_tokens": int(a), "accepted_chars": int(a) * CHARS_PER_TOKEN})
        if kd == "partial_accept" else None
        for kd, a in zip(flat(kinds), flat(accepted), strict=True)
    ]
    add(np.ones((p, k), bool), flat(kinds), t_req + tl["decision_at"], cid, None, payload)
    # Switches during own coding: not during a wait, so no cycle.
    bg = beh.bg_switch
    t_bg = t_req + tl["decision_at"] + beh.bg_frac * beh.coding_s
    bcats, bapps = _away_apps(params, beh, flat(beh.bg_cat)[flat(bg)], flat(beh.bg_app)[flat(bg)])
    none_cycle = np.full(p * k, None, dtype=object)
    add(bg, "focus_out", t_bg, none_cycle, beh.bg_away_s, _payloads(bapps, bcats))
    add(bg, "focus_in", t_bg + beh.bg_away_s, none_cycle, None, back)
    # Task boundaries.
    last_of_task = np.roll(first_of_task, -1)
    start_payload = [json.dumps({"task_id": int(t)}) for t in flat(task_ids)[flat(
        np.broadcast_to(first_of_task, (p, k)))]]
    end_payload = [json.dumps({"task_id": int(t)}) for t in flat(task_ids)[flat(
        np.broadcast_to(last_of_task, (p, k)))]]
    add(np.broadcast_to(first_of_task, (p, k)), "task_start", t_req - beh.craft_s, none_cycle,
        None, start_payload)
    add(np.broadcast_to(last_of_task, (p, k)), "task_end", t_req + tl["decision_at"] + post,
        none_cycle, None, end_payload)
    ev = pd.concat(parts, ignore_index=True).sort_values(["participant_id", "ts_ns"],
                                                         kind="stable", ignore_index=True)
    ev["source"] = "simulator"
    ev["dedupe_key"] = None
    ev["received_at"] = _to_datetimes(ev["ts_ns"].to_numpy())
    ev["id"] = None
    return ev[EVENT_COLUMNS]


def _tasks(params: SimParams, beh: Behaviour, pop: Population, targets: Targets,
           ids: list[str], task_ids: np.ndarray, t_req: np.ndarray, tl: dict[str, np.ndarray],
           post: np.ndarray, raw_ns: Callable[[np.ndarray], np.ndarray], s: float,
           first_of_task: np.ndarray) -> pd.DataFrame:
    p, k = t_req.shape
    m = beh.prompts_per_task
    first = np.arange(0, k, m)
    last = first + m - 1
    start_real = t_req[:, first] - beh.craft_s[:, first]
    end_real = t_req[:, last] + tl["decision_at"][:, last] + post[:, last]
    fast, slow = task_forecasts(beh, pop)
    t_ids = task_ids[:, first]
    per = targets.task_period.reshape(-1)
    return pd.DataFrame({
        "id": t_ids.reshape(-1),
        "participant_id": np.repeat(np.array(ids, dtype=object), beh.n_tasks),
        "name": [f"task-{t + 1}" for _ in range(p) for t in range(beh.n_tasks)],
        "description": "simulated task",
        "period": _periods(per),
        "arm": targets.task_arm.reshape(-1),
        "forecast_fast_s": fast.reshape(-1),
        "forecast_slow_s": slow.reshape(-1),
        "started_at_ns": VIRTUAL_EPOCH_NS + raw_ns(start_real).reshape(-1),
        "ended_at_ns": VIRTUAL_EPOCH_NS + raw_ns(end_real).reshape(-1),
        "status": "done",
        "time_s": None,
        "created_at": _to_datetimes(VIRTUAL_EPOCH_NS + raw_ns(start_real).reshape(-1)),
        "link": None, "post_review_s": None, "outcome": "done",
    })[TASK_COLUMNS]


def _ground_truth(config: StudyConfig, params: SimParams, pop: Population, seed: int,
                  **extra: Any) -> pd.DataFrame:
    return pd.DataFrame(ground_truth_rows(config, params, pop, seed, **extra))[TRUTH_COLUMNS]


def simulate_virtual(
    database: Database,
    config: StudyConfig,
    params: SimParams,
    n_participants: int,
    tasks: int = 4,
    prompts_per_task: int = 15,
    seed: int | None = None,
    *,
    progress: ProgressFn | None = None,
    agent_steps: int = 1,
) -> SimulationResult:
    """Enroll simulated participants and write their tasks, cycles, events and ground truth."""
    seed = new_seed() if seed is None else seed
    total = n_participants + 1
    with keep_open(database):
        ids, _keys, first = enroll_simulated(
            database, config, n_participants,
            (lambda d, _t: progress(d, total)) if progress else None,
        )
        _, first_task = next_participant_index(database)
        frames = simulate_virtual_frames(
            config, params, n_participants, tasks, prompts_per_task, seed,
            ids=ids, first_index=first, first_task_id=first_task, agent_steps=agent_steps,
        )
        # Per-prompt draws used request indices 0 … k-1 of each participant: a proxy serving
        # them later must continue past those (the counter every proxy claims from).
        counters = ([{"participant_id": p, "next_index": tasks * prompts_per_task}
                     for p in ids] if config.study.design == "per_prompt" else [])
        cycle_rows = frame_rows(frames["cycles"])
        write_rows(database, [
            WriteBatch(Task, frame_rows(frames["tasks"])),
            WriteBatch(Cycle, cycle_rows),
            WriteBatch(Turn, turn_rows_from_cycles(cycle_rows)),
            WriteBatch(Event, frame_rows(frames["events"], drop=("id",))),
            WriteBatch(GroundTruth, frame_rows(frames["ground_truth"], drop=("id",))),
            WriteBatch(DrawCounter, counters),
        ])
    if progress:
        progress(total, total)
    return SimulationResult(
        participants=ids, cycles=len(frames["cycles"]), events=len(frames["events"]),
        tasks=len(frames["tasks"]), seed=seed,
    )
