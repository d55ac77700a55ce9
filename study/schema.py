"""The study database schema (SQLModel): one database per study.

Times on the proxy's timeline are integers in nanoseconds of one monotonic clock
(``t_*_ns``); each cycle carries the wall-clock anchor of the process that recorded it
(``wall_anchor_ns`` at ``mono_anchor_ns``), so ``wall = wall_anchor_ns + (t - mono_anchor_ns)``
joins them with ActivityWatch and client events, whose ``ts_ns`` is UTC epoch ns.

Durations are stored *raw*: a study run with ``time_scale`` > 1 compresses them, and analysis
multiplies by the study's ``time_scale`` to get back to real seconds.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, Index, MetaData, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

#: Bumped with every Alembic revision in ``study/migrations/versions`` (revision ``000N``).
SCHEMA_VERSION = 12


def _big() -> Column:
    return Column(BigInteger, nullable=True)


class Meta(SQLModel, table=True):
    """Key/value facts about the database itself (schema version, creator)."""

    __tablename__ = "meta"
    key: str = Field(primary_key=True)
    value: str


class Study(SQLModel, table=True):
    """The study this database belongs to (exactly one row)."""

    __tablename__ = "studies"
    id: int | None = Field(default=None, primary_key=True)
    name: str
    seed: int
    design: str
    unit: str
    time_scale: float = 1.0
    config_json: str = Field(sa_column=Column(Text, nullable=False))
    config_toml: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    randomization_fingerprint: str
    created_at: datetime


class Arm(SQLModel, table=True):
    __tablename__ = "arms"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    jitter: float = 0.0
    delivery: str = "stream"
    weight: float = 1.0
    shaped: bool = True


class Participant(SQLModel, table=True):
    """A pseudonymous participant. Only a salted hash of the API key is kept."""

    __tablename__ = "participants"
    id: str = Field(primary_key=True)
    key_id: str = Field(unique=True, index=True)
    key_salt: str
    key_hash: str
    enrolled_index: int
    consent_at: datetime | None = None
    created_at: datetime
    simulated: bool = False
    working_apps_json: str | None = None  # per-participant override of the study's list
    # Field studies (schema 8, docs/researchers/field-study.md): the version of the consent
    # text agreed to (consent_at is when), when the participant withdrew (nothing of theirs
    # is recorded after it), and how many requests the proxy refused before consent.
    consent_version: str | None = None
    withdrawn_at: datetime | None = None
    refused_requests: int = 0
    #: The name a team member chose to show in the team view (opt-in; schema 10). Team
    #: members are keyed by a salted pseudonym of their identity, never the identity.
    display_name: str | None = None


class Assignment(SQLModel, table=True):
    """Which arm a participant gets, per period (parallel designs have period 0 only)."""

    __tablename__ = "assignments"
    __table_args__ = (UniqueConstraint("participant_id", "period"),)
    id: int | None = Field(default=None, primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    period: int = 0
    arm: str
    sequence: int | None = None  # crossover: which Williams sequence
    block: int | None = None
    created_at: datetime


class Task(SQLModel, table=True):
    """A unit of work; forecasts are entered before the arm is revealed (METR-style)."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("participant_id", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    name: str
    description: str | None = None
    period: int | None = None
    arm: str | None = None
    forecast_fast_s: float | None = None  # forecast with the fast arm
    forecast_slow_s: float | None = None  # forecast without it (the slow / control arm)
    started_at_ns: int | None = Field(default=None, sa_column=_big())
    ended_at_ns: int | None = Field(default=None, sa_column=_big())
    status: str = "planned"  # planned | started | done | abandoned
    time_s: float | None = None  # imported task time, when start/end are not observed
    created_at: datetime
    # Schema 8: the task's pull request or issue, the implementation time after review
    # (METR's post-review time) and the final outcome: done | abandoned | failed_review.
    link: str | None = None
    post_review_s: float | None = None
    outcome: str | None = None


class Cycle(SQLModel, table=True):
    """One prompt -> wait -> review -> decision cycle, as the proxy saw it."""

    __tablename__ = "cycles"
    __table_args__ = (Index("ix_cycles_participant_request", "participant_id", "t_request_ns"),)
    id: str = Field(primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    arm: str = Field(index=True)
    task_id: int | None = None
    period: int | None = None
    protocol: str  # chat | completions | responses | messages
    transport: str = "http"  # http | websocket
    stream: bool = True
    turn: int = 1
    connection_id: str | None = None
    model: str | None = None
    upstream: str = "mock"
    upstream_response_id: str | None = None
    # The cycle timeline (docs/concepts/timeline.md; monotonic ns) and the wall-clock
    # anchor of the process.
    mono_anchor_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    wall_anchor_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    t_request_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    t_upstream_first_ns: int | None = Field(default=None, sa_column=_big())
    t_first_sent_ns: int | None = Field(default=None, sa_column=_big())
    t_last_sent_ns: int | None = Field(default=None, sa_column=_big())
    t_done_ns: int | None = Field(default=None, sa_column=_big())
    started_at: datetime
    # What was targeted, and what the participant experienced (raw, not time-scaled).
    shaped: bool = True
    target_ttft_ms: float | None = None
    target_tps: float | None = None
    target_jitter: float | None = None
    target_delivery: str | None = None
    #: Delivery granularity used: tokens due within this frame left together (ms); 0 one
    #: write per token; None not paced (unshaped, all_at_once, non-streaming).
    frame_ms: float | None = None
    draw_json: str | None = None  # per-prompt randomization draw
    experienced_ttft_ms: float | None = None
    generation_wait_ms: float | None = None
    achieved_tps: float | None = None
    violation: bool = False
    violation_ms: float | None = None  # how far the upstream made us miss the target
    # Token counts: exact from upstream usage when given, else approximated.
    tokens_prompt: int | None = None
    tokens_completion: int | None = None
    tokens_sent: int | None = None  # content pieces delivered to the client
    usage_exact: bool = False
    tool_calls: int = 0
    status: str = "ok"  # ok | error | upstream_error | abandoned
    http_status: int | None = None
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # Content per the study's capture setting.
    prompt_fingerprint: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    content_fingerprint: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    prompt_text: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    content_text: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    content_chars: int | None = None
    simulated: bool = False
    # Which proxy process recorded the cycle (``host:pid``, or the proxy's --instance name):
    # several proxies may record into one PostgreSQL database. Schema version 2.
    recorded_by: str | None = None
    # Agent turns (schema version 4, docs/concepts/turns.md): what the request was
    # (human | continuation | side | retry), the rule that decided it, the turn it belongs to,
    # its conversation and client, and when the upstream's last event reached the proxy
    # (so the latency the proxy injected is t_last_sent - t_upstream_last).
    request_kind: str | None = None
    kind_rule: str | None = None
    turn_id: str | None = Field(default=None, index=True)
    conversation_key: str | None = None
    client: str | None = None
    t_upstream_last_ns: int | None = Field(default=None, sa_column=_big())
    #: The upstream's first output (text or a tool call) reached the proxy (schema 6);
    #: ``t_upstream_first_ns`` is its first bytes, often a structure event before any output.
    t_upstream_first_output_ns: int | None = Field(default=None, sa_column=_big())
    #: Schema 11 (docs/concepts/turns.md): the client's SDK (``client`` is the agent); a
    #: hash of the request's new user text and whether it offered tools (what a later
    #: request's revision compares); the kind and rule a revision replaced (``human:new_input``).
    client_sdk: str | None = None
    input_key: str | None = None
    offers_tools: bool | None = None
    revised_from: str | None = None
    #: The model the upstream was asked for when the cycle's arm replaced the client's
    #: ``model`` (schema 7, ``[[arms]] model``); NULL: the client's own (``model``) was served.
    served_model: str | None = None


class Turn(SQLModel, table=True):
    """One agent turn: a person's prompt and every model call it set off until the final
    answer (schema version 4). Built by the proxy as requests arrive and rebuilt from the
    cycles by :func:`flowtrial.study.turns.rebuild_turns`; durations are raw (not
    time-scaled), in ms; ``wait_ms = model_ms + tool_ms + gap_ms``."""

    __tablename__ = "turns"
    id: str = Field(primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    arm: str
    period: int | None = None
    task_id: int | None = None
    protocol: str
    client: str | None = None
    conversation_key: str | None = None
    mono_anchor_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    wall_anchor_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    t_start_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    t_end_ns: int | None = Field(default=None, sa_column=_big())
    started_at: datetime
    model_calls: int = 0
    side_calls: int = 0
    retries: int = 0
    tool_calls: int = 0
    wait_ms: float | None = None
    model_ms: float | None = None
    injected_ms: float | None = None
    tool_ms: float | None = None
    gap_ms: float | None = None
    status: str = "open"  # open | complete | error
    first_cycle_id: str
    last_cycle_id: str | None = None
    simulated: bool = False


class Event(SQLModel, table=True):
    """A client, page, simulator or ActivityWatch event on a participant's timeline."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_participant_ts", "participant_id", "ts_ns"),)
    id: int | None = Field(default=None, primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    cycle_id: str | None = Field(default=None, index=True)
    kind: str = Field(index=True)
    ts_ns: int = Field(sa_column=Column(BigInteger, nullable=False))  # UTC epoch ns
    duration_s: float | None = None
    source: str = "client"  # client | page | simulator | activitywatch | continue
    payload_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # Makes imports idempotent: importing the same event twice adds nothing.
    dedupe_key: str | None = Field(default=None, unique=True)
    received_at: datetime


class QuestionnaireAnswer(SQLModel, table=True):
    __tablename__ = "questionnaire_answers"
    id: int | None = Field(default=None, primary_key=True)
    participant_id: str = Field(foreign_key="participants.id", index=True)
    task_id: int | None = None
    instrument: str  # e.g. flow_short_scale | nasa_tlx
    item: str
    value: float
    answered_at: datetime


class Persistence(SQLModel, table=True):
    """Whether a completion's text persisted in later prompts (passive acceptance)."""

    __tablename__ = "persistence"
    __table_args__ = (UniqueConstraint("cycle_id", "interval_s"),)
    id: int | None = Field(default=None, primary_key=True)
    cycle_id: str = Field(index=True)
    interval_s: float
    score: float
    persisted: bool
    checked_against: str | None = None  # id of the later cycle whose prompt was compared


class GroundTruth(SQLModel, table=True):
    """Simulator ground truth, so analysis can be scored against what was really there."""

    __tablename__ = "ground_truth"
    id: int | None = Field(default=None, primary_key=True)
    scope: str  # population | participant
    participant_id: str | None = None
    truth_model: str
    params_json: str = Field(sa_column=Column(Text, nullable=False))


class DrawCounter(SQLModel, table=True):
    """The next unclaimed per-prompt request index of a participant. Proxy processes claim
    blocks of indices from it in one transaction, so separate proxies (and the workers of
    one) never draw the same index twice (schema version 3)."""

    __tablename__ = "draw_counters"
    participant_id: str = Field(primary_key=True)
    next_index: int = Field(sa_column=Column(BigInteger, nullable=False))


class Audit(SQLModel, table=True):
    """What was done to participants' data (withdrawal, deletion): names no content, only
    the action, the participant's id and row counts (schema version 8)."""

    __tablename__ = "audit"
    id: int | None = Field(default=None, primary_key=True)
    at: datetime
    action: str  # withdraw | delete
    participant_id: str  # no foreign key: the line outlives the participant's rows
    detail_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class TeamTurn(SQLModel, table=True):
    """One agent turn of a team study, from the agents' telemetry alone (schema 10; built
    and documented in ``flowtrial.study.team_turns``)."""

    __tablename__ = "team_turns"
    __table_args__ = (Index("ix_team_turns_participant_start", "participant_id", "start_ns"),)
    id: str = Field(primary_key=True)
    participant_id: str = Field(index=True)
    agent: str
    model: str
    week: int = Field(index=True)  # Monday-based weeks since the epoch (UTC)
    start_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    end_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    first_call_ns: int | None = Field(default=None, sa_column=_big())
    wait_ns: float
    calls: int = 0
    decided: int = 0
    accepted: int = 0
    decide_s: float = 0.0
    gap_ns: int | None = Field(default=None, sa_column=_big())


#: Edges of the team view's wait bins (real seconds): bin ``i`` holds waits in
#: ``[edge i, edge i+1)`` (bin 0 also anything shorter), the last bin everything from the
#: last edge on. ``TeamWeek.w00`` … ``w10`` count them.
WAIT_EDGES_S = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class TeamWeek(SQLModel, table=True):
    """The weekly rollup of ``team_turns`` (schema 12): per person, agent, model and week,
    kept up in the transaction that writes the person's turns (``flowtrial.study.team_rollup``
    builds it and documents each column). Durations raw; bins at the study's time scale."""

    __tablename__ = "team_weeks"
    participant_id: str = Field(primary_key=True)
    agent: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    week: int = Field(primary_key=True, index=True)
    turns: int = 0
    calls: int = 0
    wait_ns: float = 0.0
    active_ns: float = 0.0
    decided: int = 0
    accepted: int = 0
    decide_s: float = 0.0
    switches: int = 0
    captured: int = 0  # 1 when the person had focus capture that week (else switches are "—")
    w00: int = 0
    w01: int = 0
    w02: int = 0
    w03: int = 0
    w04: int = 0
    w05: int = 0
    w06: int = 0
    w07: int = 0
    w08: int = 0
    w09: int = 0
    w10: int = 0


TABLES: list[type[SQLModel]] = [
    Meta, Study, Arm, Participant, Assignment, Task, Cycle, Event,
    QuestionnaireAnswer, Persistence, GroundTruth, DrawCounter, Turn, Audit, TeamTurn,
    TeamWeek,
]


def metadata() -> MetaData:
    """The metadata of every table above (what migrations compare the database against)."""
    return SQLModel.metadata
