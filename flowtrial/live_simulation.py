"""Live simulation: simulated participants drive the real proxy over HTTP.

Each participant is an asyncio task with its own official ``openai`` SDK client
(``AsyncOpenAI``, streaming chat completions, authenticated with the API key ``enroll``
returned) pointed at the proxy, and an ``httpx`` client posting focus, decision and task
events to the proxy's event API (``POST /flowtrial/v1/events``). The proxy shapes latency
per the study (per-prompt draws or arms, compressed by ``study.time_scale``) and records the
cycles; the participant measures when tokens actually arrive, converts the experienced wait
back to real seconds, and decides about switching with the same behaviour model and the same
random draws as a virtual run of the same seed. Its own human durations (crafting, time
away, resumption, reading, review, own coding, task breaks) are acted out compressed by
``time_scale``. Tasks (rows and task_start/task_end events) and the ground truth are written
by the simulator; cycles are the proxy's.

With ``agent_steps`` K > 1 each prompt is an agent turn (live_requests.py): the prompt offers
a tool, the simulated model answers with K − 1 tool calls (the in-process proxy's
``[upstream] tool_steps`` is set to K − 1), each followed after the tool's run time
(``SimParams.tool_time``, the same draws as a virtual run) by a continuation, then the
answer. The proxy's turn tracker builds the turns; the person waits for, and switches
during, the whole turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import func, select

from flowtrial.instrumentation.proxy.runtime_tuning import tuned_process
from flowtrial.live_requests import LIVE_MODEL, Clock, Hooks, run_turn
from flowtrial.study.config import StudyConfig
from flowtrial.study.errors import FlowtrialError
from flowtrial.study.participants import PER_PROMPT_ARM, assignments_for
from flowtrial.study.schema import Cycle, Event, GroundTruth
from flowtrial.study.simulator.agent import tool_run_times
from flowtrial.study.simulator.capability import LiveAttempts, factorial_truth, live_attempts
from flowtrial.study.simulator.model import (
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
from flowtrial.study.simulator.params import SimParams
from flowtrial.study.simulator.records import (
    ProgressFn,
    SimulationResult,
    enroll_simulated,
    ground_truth_rows,
    new_seed,
)
from flowtrial.study.simulator.timing import TimerProbe
from flowtrial.study.simulator.virtual import CHARS_PER_TOKEN, WORKING_CATEGORY
from flowtrial.study.storage import Database, WriteBatch, write_rows
from flowtrial.study.tasks import add_task, end_task, link_cycles_to_tasks
from flowtrial.study.timeline import idle_wait_s

EVENTS_PATH = "/flowtrial/v1/events"

_PROMPTS = (
    "In my Python service, step {j} of task {t}: write a function that retries a flaky HTTP "
    "call with backoff.",
    "Task {t}, step {j}: refactor this Python loop into a list comprehension and add type "
    "hints.",
    "Step {j} of task {t}: add a pytest test for the parser in this Python module.",
    "Task {t} / step {j}: explain why this Python async code deadlocks and fix it.",
    "Step {j} (task {t}): write a Python dataclass for the config and validate its fields.",
)


class LiveSimulationError(FlowtrialError):
    """The live simulation could not run (proxy missing or unreachable)."""


@dataclass
class ObservedCycle:
    """What one simulated participant observed and did in one cycle (client side)."""

    participant_id: str
    index: int
    cycle_id: str | None
    sent_wall_ns: int
    ttft_raw_s: float
    gen_wait_raw_s: float
    n_tokens: int
    tps_raw: float
    idle_wait_s: float  # real seconds, at the participant's reading speed
    p_switch: float
    switched: bool
    time_away_s: float
    decision: str
    error: str | None = None
    calls: int = 1  # model calls of the turn
    tool_s: float = 0.0  # real seconds of tool time in the turn


@dataclass
class _Run:
    """Everything the participants share."""

    database: Database
    config: StudyConfig
    params: SimParams
    base_url: str
    ids: list[str]
    keys: list[str]
    pop: Population
    beh: Behaviour
    progress: Callable[[], None]
    tool_s: np.ndarray | None = None  # (p, k, K − 1) real seconds per tool run (agent turns)
    attempts: LiveAttempts | None = None  # models of a speed-vs-capability study
    observed: list[ObservedCycle] = field(default_factory=list)
    event_errors: list[str] = field(default_factory=list)

    @property
    def scale(self) -> float:
        return self.config.study.time_scale


def compression_warnings(config: StudyConfig) -> list[str]:
    """Targets that ``time_scale`` compresses below what the simulated model can deliver.

    The proxy only ever slows delivery, so a compressed TTFT shorter than the model's own,
    or a compressed pace faster than the model's, makes such cycles manipulation violations.
    """
    up = config.upstream
    if up.kind != "mock":
        return []
    s = config.study.time_scale
    floor_ms, pace = up.mock.ttft_ms, up.mock.tokens_per_second
    ttfts: list[tuple[str, float]] = []
    paces: list[tuple[str, float]] = []
    pp = config.per_prompt
    if config.study.design == "per_prompt" and pp is not None:
        if pp.ttft_ms:
            ttfts.append(("[per_prompt] ttft_ms.min", pp.ttft_ms.min))
        if pp.tokens_per_second:
            paces.append(("[per_prompt] tokens_per_second.max", pp.tokens_per_second.max))
    else:
        ttfts += [(f"arm {a.name!r} ttft_ms", a.ttft_ms) for a in config.arms if a.ttft_ms]
        paces += [(f"arm {a.name!r} tokens_per_second", a.tokens_per_second)
                  for a in config.arms if a.tokens_per_second]
    out = [
        f"{name} = {v:g} ms is {v / s:.1f} ms at time_scale {s:g}, below the simulated "
        f"model's own {up.mock.ttft_ms:g} ms: expect violations (lower time_scale or "
        "[upstream.mock] ttft_ms)"
        for name, v in ttfts if v / s < floor_ms
    ]
    out += [
        f"{name} = {v:g}/s is {v * s:g}/s at time_scale {s:g}, faster than the simulated "
        f"model's {pace:g}/s: expect violations (raise [upstream.mock] tokens_per_second)"
        for name, v in paces if v * s > pace
    ]
    return out


def _require_proxy() -> Any:
    try:
        from flowtrial.proxy_assembly import serve_proxy
    except ImportError as exc:
        raise LiveSimulationError(
            f"live mode needs the flowtrial proxy (flowtrial.instrumentation.proxy): {exc}; "
            "use --mode virtual"
        ) from None
    return serve_proxy


def simulate_live(
    database: Database,
    config: StudyConfig,
    params: SimParams,
    n_participants: int,
    tasks: int = 4,
    prompts_per_task: int = 15,
    seed: int | None = None,
    *,
    base_url: str | None = None,
    progress: ProgressFn | None = None,
    agent_steps: int = 1,
    enrolled: tuple[list[str], list[str], int] | None = None,
) -> SimulationResult:
    """Run simulated participants against the proxy (started in-process unless ``base_url``).

    With ``base_url`` the proxy must record into ``database`` (participants are enrolled
    there). Returns what was written; ``extra["observed"]`` is a DataFrame of what the
    participants observed client-side, ``extra["event_errors"]`` failed event posts.
    With ``agent_steps`` K > 1 (a mock upstream) each prompt is an agent turn of K calls; a
    proxy at ``base_url`` must have ``[upstream] tool_steps = K − 1`` itself.
    ``enrolled``: ``enroll_simulated``'s (ids, keys, first index) of participants enrolled
    before the proxy at ``base_url`` started, so that it claimed their per-prompt draw
    indices at startup in one transaction rather than one write each on their first
    requests (40 of those at once took 1-2 s on a busy machine: every first token late).
    """
    if n_participants < 1 or tasks < 1 or prompts_per_task < 1:
        raise LiveSimulationError("need at least one participant, task and prompt per task")
    if agent_steps > 1:
        if config.upstream.kind != "mock":
            raise LiveSimulationError(
                "live agent turns need the simulated model ([upstream] kind = \"mock\"): its "
                "tool steps make the tool calls")
        config = config.model_copy(update={"upstream": config.upstream.model_copy(
            update={"tool_steps": agent_steps - 1})})
    seed = new_seed() if seed is None else seed
    serve_proxy = None if base_url is not None else _require_proxy()
    if enrolled is not None and len(enrolled[0]) != n_participants:
        raise LiveSimulationError(f"{len(enrolled[0])} participants enrolled for "
                                  f"{n_participants}")
    ids, keys, _first = enrolled or enroll_simulated(database, config, n_participants)
    rng_pop, rng_beh, _ = rng_streams(seed)
    pop = draw_population(params, ids, rng_pop)
    beh = draw_behaviour(params, pop, tasks, prompts_per_task, rng_beh)
    tool_s = (tool_run_times(agent_steps, (n_participants, beh.n_cycles), seed,
                             params.tool_time.median, params.tool_time.logsd)
              if agent_steps > 1 else None)
    attempts = live_attempts(config, params, n_participants, beh.n_cycles, seed)
    extra: dict[str, Any] = {"agent_steps": agent_steps} if agent_steps > 1 else {}
    if attempts is not None:  # the same people replayed under every arm (virtually)
        extra["speed_capability"] = factorial_truth(
            config, params, n_participants, tasks, prompts_per_task, seed, ids=ids,
            first_index=_first)
    write_rows(database, [WriteBatch(GroundTruth, [
        {k: v for k, v in row.items() if k != "id"}
        for row in ground_truth_rows(config, params, pop, seed, mode="live",
                                     n_tasks=tasks, prompts_per_task=prompts_per_task,
                                     **extra)
    ])])
    total = n_participants * tasks * prompts_per_task
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress:
            progress(done[0], total)

    started = time.perf_counter()
    # The in-process proxy and the participants share the GIL. Python hands it over every
    # 5 ms by default, which would delay token writes and arrivals by up to 5 ms: a
    # manipulation violation at the proxy, and a wait error of 5 ms × time_scale for the
    # participant. A short interval keeps both threads responsive. A full garbage collection
    # walks every object the process has imported (pandas, SQLAlchemy, the SDK, the proxy:
    # ~200k objects, 0.1-0.3 s) with both threads stopped: freeze what exists now so the
    # collector only looks at what the run allocates.
    with tuned_process(switch_interval_s=0.0002):
        with TimerProbe() as probe:
            if serve_proxy is not None:
                with serve_proxy(database.url, config) as handle:
                    run = _Run(database, config, params, handle.base_url.rstrip("/"), ids,
                               keys, pop, beh, tick, tool_s, attempts)
                    asyncio.run(_run_all(run))
            else:
                assert base_url is not None
                run = _Run(database, config, params, base_url.rstrip("/"), ids, keys, pop,
                           beh, tick, tool_s, attempts)
                asyncio.run(_run_all(run))
    elapsed = time.perf_counter() - started
    link_cycles_to_tasks(database, ids)
    with database.session() as s:
        n_cycles = s.execute(select(func.count()).select_from(Cycle).where(
            Cycle.participant_id.in_(ids))).scalar_one()  # type: ignore[attr-defined]
        n_events = s.execute(select(func.count()).select_from(Event).where(
            Event.participant_id.in_(ids))).scalar_one()  # type: ignore[attr-defined]
    observed = pd.DataFrame([vars(o) for o in run.observed])
    return SimulationResult(
        participants=ids, cycles=int(n_cycles), events=int(n_events),
        tasks=n_participants * tasks, seed=seed, mode="live",
        extra={"observed": observed, "event_errors": run.event_errors,
               "elapsed_s": elapsed, "timer_late_rate": probe.rate,
               "request_errors": int(observed["error"].notna().sum()) if len(observed) else 0},
    )


def _warm_sdk() -> None:
    """Import and exercise the SDK's chunk types once, before any wait is being timed (the
    first parse otherwise costs tens of ms that would count as waiting)."""
    from openai.types.chat import ChatCompletionChunk

    from flowtrial.instrumentation.tokens import count_tokens

    ChatCompletionChunk.model_validate({
        "id": "warm", "object": "chat.completion.chunk", "created": 0, "model": LIVE_MODEL,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "x"},
                     "finish_reason": None}],
    })
    count_tokens("warm up")


async def _run_all(run: _Run) -> None:
    _warm_sdk()
    await asyncio.gather(*(_participant(run, i) for i in range(len(run.ids))))


def _ts(wall_ns: float) -> float:
    """Event API timestamp: epoch seconds."""
    return wall_ns / 1e9


async def _post(run: _Run, http: Any, events: list[dict[str, Any]]) -> None:
    try:
        r = await http.post(EVENTS_PATH, json={"events": events})
        if r.status_code != 200 or r.json().get("accepted") != len(events):
            run.event_errors.append(f"{r.status_code}: {r.text[:200]}")
    except Exception as exc:  # noqa: BLE001 - a failed post is reported, not fatal
        run.event_errors.append(f"{type(exc).__name__}: {exc}")


def _away(run: _Run, cat: int, app: int) -> dict[str, str]:
    category = run.beh.categories[int(cat)]
    apps = run.params.away_apps[category]
    return {"app": apps[int(app) % len(apps)], "category": category}


async def _participant(run: _Run, i: int) -> None:
    import httpx
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    pid, key, beh, scale = run.ids[i], run.keys[i], run.beh, run.scale
    fast, slow = task_forecasts(beh, run.pop)
    arms = await asyncio.to_thread(assignments_for, run.database, pid)
    hooks = Hooks()
    client = AsyncOpenAI(
        api_key=key, base_url=run.base_url + "/v1", max_retries=0,
        timeout=run.config.upstream.timeout_s,
        http_client=DefaultAsyncHttpxClient(
            event_hooks={"request": [hooks.on_request], "response": [hooks.on_response]}),
    )
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=run.base_url, headers=headers, timeout=60.0) as http:
        try:
            # Authenticated and arm-neutral: opens the connection and checks the key before
            # anything is timed.
            await client.models.list()
            for t in range(beh.n_tasks):
                await asyncio.sleep(beh.gap_s[i, t] / scale)
                period = t % len(arms) if arms else None
                arm = arms.get(period, PER_PROMPT_ARM) if period is not None else PER_PROMPT_ARM
                start_ns = time.time_ns()
                task_id = await asyncio.to_thread(
                    add_task, run.database, pid, f"task-{t + 1}", arm=arm, period=period,
                    forecast_fast_s=float(fast[i, t]), forecast_slow_s=float(slow[i, t]),
                    description="simulated task", started_at_ns=start_ns)
                payload = {"task_id": task_id, "name": f"task-{t + 1}"}
                await _post(run, http, [{"kind": "task_start", "ts": _ts(start_ns),
                                         "payload": payload}])
                good = 0
                att = run.attempts
                for j in range(beh.prompts_per_task):
                    k = t * beh.prompts_per_task + j
                    await asyncio.sleep(beh.craft_s[i, k] / scale)
                    # With models (capability.py): a good answer is accepted, a bad one is
                    # why the person asks again, until the task has its good answers.
                    ok = None if att is None else att.good(i, k, arm)
                    await _cycle(run, client, hooks, http, i, k, t, j,
                                 None if ok is None else ("accept" if ok else "reject"))
                    run.progress()
                    good += bool(ok)
                    if att is not None and good >= att.steps:
                        break
                end_ns = time.time_ns()
                await _post(run, http, [{"kind": "task_end", "ts": _ts(end_ns),
                                         "payload": payload}])
                status = "done" if att is None or good >= att.steps else "abandoned"
                await asyncio.to_thread(end_task, run.database, task_id, end_ns, status)
        finally:
            await client.close()


@dataclass(frozen=True)
class ProxyView:
    """A turn as the proxy recorded it, on the participant's clock (raw seconds): what the
    analysis will read as this wait."""

    request: float  # the turn's first call reached the proxy
    first_sent: float  # the final answer's first token left the proxy
    last_sent: float  # ... and its last
    achieved_tps_raw: float | None  # the final answer's pace as delivered (raw tokens/s)


def _proxy_view(database: Database, cycle_ids: list[str | None], clock: Clock
                ) -> ProxyView | None:
    """The proxy's record of a turn: its first call's t_request, the final call's
    t_first_sent, t_last_sent and achieved pace, on the participant's clock.

    A simulator's privilege, not a client's. On a busy machine the client sees tokens some
    ms after the proxy sent them (the participants and the in-process proxy share two
    cores and the GIL), and ``time_scale`` multiplies that: 13 ms of client lag at 75× is a
    1 s longer wait than the one recorded, which no real person at a real editor has. A
    person acting on the client's view therefore behaves as if every recorded wait were
    longer, and the analysis finds the threshold that much too early (a low bias of ~1 s
    measured on the demo). So the simulated person acts on the wait the proxy delivered,
    which is the wait the analysis reads, and places a switch inside the proxy's window
    (a switch just after t_last_sent would not count as during the wait,
    docs/concepts/timeline.md). The proxy makes the record durable before it closes the
    stream, so it is there to read.
    """
    if not cycle_ids or cycle_ids[0] is None or cycle_ids[-1] is None:
        return None
    t = Cycle.__table__  # type: ignore[attr-defined]
    wall = t.c.wall_anchor_ns - t.c.mono_anchor_ns
    with database.engine.connect() as conn:
        request = conn.execute(select(wall + t.c.t_request_ns)
                               .where(t.c.id == cycle_ids[0])).scalar()
        final = conn.execute(select(wall + t.c.t_first_sent_ns, wall + t.c.t_last_sent_ns,
                                    t.c.achieved_tps)
                             .where(t.c.id == cycle_ids[-1])).first()
    if request is None or final is None or final[0] is None or final[1] is None:
        return None

    def raw(wall_ns: int) -> float:
        return (wall_ns - clock.wall0) / 1e9

    tps = None if final[2] is None else float(final[2])
    return ProxyView(raw(request), raw(final[0]), raw(final[1]), tps)


async def _cycle(run: _Run, client: Any, hooks: Hooks, http: Any, i: int, k: int, t: int,
                 j: int, decision: str | None = None) -> None:
    """One prompt -> wait -> review -> decision cycle (an agent turn with agent steps),
    then own coding."""
    beh, pop, params, scale = run.beh, run.pop, run.params, run.scale
    pid = run.ids[i]
    n_ask = int(beh.n_tokens[i, k])
    prompt = _PROMPTS[k % len(_PROMPTS)].format(t=t + 1, j=j + 1) + f" ({pid}, #{k + 1})"
    clock = Clock(scale)
    tools = [] if run.tool_s is None else [float(v) / scale for v in run.tool_s[i, k]]
    turn = await run_turn(client, hooks, clock, prompt, n_ask, tools)
    arrivals, counts, usage = turn.arrivals, turn.counts, turn.usage
    headers_at, cycle_id = turn.headers_at, turn.final_cycle_id
    if turn.error is not None or not arrivals:
        run.observed.append(ObservedCycle(
            pid, k, cycle_id, clock.wall0, float("nan"), float("nan"), 0, float("nan"),
            float("nan"), float("nan"), False, float("nan"), "none",
            turn.error or "no content received", len(turn.cycle_ids),
            turn.tool_raw_s * scale))
        await clock.until_raw(clock.raw_now() + beh.coding_s[i, k] / scale)
        return

    # What the participant experienced, converted back to real seconds: the wait the
    # proxy delivered (``_proxy_view``), else what the client saw.
    n = int(usage or sum(counts))
    first, last = arrivals[0], arrivals[-1]
    tps_raw = (n - 1) / (last - first) if n > 1 and last > first else float("nan")
    ttft_raw, pace_raw, origin = first, tps_raw, 0.0
    view = await asyncio.to_thread(_proxy_view, run.database, turn.cycle_ids, clock)
    if view is not None:  # the person's timeline starts when the proxy got the prompt
        ttft_raw, origin = view.first_sent - view.request, view.request
        if view.achieved_tps_raw is not None and view.achieved_tps_raw > 0:
            pace_raw = view.achieved_tps_raw
    ttft = ttft_raw * scale
    tps = pace_raw / scale
    r = float(pop.reading_tps[i])
    idle = float(idle_wait_s(ttft, n, tps, r))
    tl = cycle_timeline(
        params, ttft_s=np.array(ttft), tps=np.array(tps), n_tokens=np.array(n),
        idle_s=np.array(idle), reading_tps=np.array(r),
        threshold_s=np.array(pop.threshold_s[i]), u_switch=np.array(beh.u_switch[i, k]),
        switch_frac=np.array(beh.switch_frac[i, k]), away_s=np.array(beh.away_s[i, k]),
        resume_z=np.array(beh.resume_z[i, k]), verify_s=np.array(beh.verify_s[i, k]),
        switch_offset=None if pop.switch_offset is None else float(pop.switch_offset[i]),
    )
    switched = bool(tl["switched"])
    if switched:
        out_raw = origin + float(tl["switch_at"]) / scale
        # Inside the proxy's window (else, not recorded, which should not happen: inside
        # what the client saw).
        window = ((view.request, view.last_sent) if view is not None
                  else (headers_at, last))
        lo, hi = window[0] + 0.0005, window[1] - 0.0005
        out_raw = min(max(out_raw, lo), hi) if lo <= hi else (window[0] + window[1]) / 2
        away_raw = float(beh.away_s[i, k]) / scale
        await _post(run, http, [{
            "kind": "focus_out", "ts": _ts(clock.wall_at(out_raw)), "cycle_id": cycle_id,
            "duration_s": away_raw,
            "payload": _away(run, beh.away_cat[i, k], beh.away_app[i, k]),
        }])
        await clock.until_raw(out_raw + away_raw)
        await _post(run, http, [{
            "kind": "focus_in", "ts": _ts(clock.wall_at(out_raw + away_raw)),
            "cycle_id": cycle_id,
            "payload": {"app": params.working_app, "category": WORKING_CATEGORY},
        }])
    decision_raw = origin + float(tl["decision_at"]) / scale
    await clock.until_raw(decision_raw)
    kind = decision or str(decide(np.array(beh.u_decision[i, k]), np.array(pop.acceptance[i]),
                                  np.array(pop.partial_accept[i])))
    ev: dict[str, Any] = {"kind": kind, "ts": _ts(clock.wall_at(decision_raw)),
                          "cycle_id": cycle_id}
    if kind == "partial_accept":
        acc = int(round(beh.partial_frac[i, k] * n))
        ev["payload"] = {"accepted_tokens": acc, "accepted_chars": acc * CHARS_PER_TOKEN}
    await _post(run, http, [ev])
    run.observed.append(ObservedCycle(
        pid, k, cycle_id, clock.wall0, first, last, n, tps_raw, idle, float(tl["p_switch"]),
        switched, float(beh.away_s[i, k]) if switched else float("nan"), kind, None,
        len(turn.cycle_ids), turn.tool_raw_s * scale))

    # Own coding until the next prompt, perhaps with a switch unrelated to the assistant.
    coding_raw = float(beh.coding_s[i, k]) / scale
    end_raw = decision_raw + coding_raw
    if beh.bg_switch[i, k]:
        out_raw = decision_raw + float(beh.bg_frac[i, k]) * coding_raw
        away_raw = float(beh.bg_away_s[i, k]) / scale
        resume_raw = float(resumption_s(params, beh.bg_away_s[i, k], beh.bg_resume_z[i, k])
                           ) / scale
        await clock.until_raw(out_raw)
        await _post(run, http, [{
            "kind": "focus_out", "ts": _ts(clock.wall_at(out_raw)), "duration_s": away_raw,
            "payload": _away(run, beh.bg_cat[i, k], beh.bg_app[i, k]),
        }])
        await clock.until_raw(out_raw + away_raw)
        await _post(run, http, [{
            "kind": "focus_in", "ts": _ts(clock.wall_at(out_raw + away_raw)),
            "payload": {"app": params.working_app, "category": WORKING_CATEGORY},
        }])
        end_raw += away_raw + resume_raw
    await clock.until_raw(end_raw)

