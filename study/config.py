"""The study configuration (`study.toml`), validated with pydantic.

A study file names the design, the arms and their latency profiles, the upstream model and
what is captured. Every problem is reported as one line naming its key, e.g.
``arms[1].tokens_per_second: must be > 0``, so a researcher can fix them all in one go.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import FlowtrialError
from .questionnaire import QuestionnaireSection

Design = Literal["parallel", "crossover", "per_prompt", "observe"]
Unit = Literal["participant", "task", "session", "prompt"]
Delivery = Literal["stream", "all_at_once"]
ContentMode = Literal["none", "fingerprint", "full"]
UpstreamKind = Literal["mock", "openai", "anthropic", "gemini"]
#: Whose credential reaches a real upstream: the study's key (``api_key_env``) or each
#: participant's own (pass-through: docs/operators/credentials.md).
Credentials = Literal["study", "participant"]
#: The API families a proxy forwards to, as ``[upstream.<family>]`` tables.
FAMILIES = ("openai", "anthropic", "gemini")

# Which randomization units make sense for each design.
ALLOWED_UNITS: dict[str, tuple[str, ...]] = {
    "parallel": ("participant",),
    "crossover": ("task", "session"),
    "per_prompt": ("prompt",),
    "observe": ("participant",),  # a team's own work, no trial: nothing is randomized
}

DEFAULT_WORKING_APPS = [
    # Editors and IDEs
    "code", "code - insiders", "cursor", "windsurf", "vscodium", "zed", "sublime_text",
    "pycharm", "intellij idea", "webstorm", "goland", "clion", "rider", "android studio",
    "xcode", "vim", "nvim", "neovim", "emacs", "helix",
    # Terminals
    "terminal", "iterm2", "alacritty", "kitty", "wezterm", "gnome-terminal",
    "konsole", "windowsterminal", "warp", "ghostty", "tmux",
]

ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Shapes of real secrets people paste by mistake where an env var *name* belongs.
SECRET_RE = re.compile(r"^(sk-|sk_|ft_|xai-|gsk_|AIza)|^[A-Za-z0-9_\-]{40,}$")


class ConfigError(FlowtrialError):
    """A study file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], source: str = "study.toml") -> None:
        self.problems = problems
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class _Strict(BaseModel):
    # Unknown keys are errors: a typo such as `tokens_per_secnd` must not silently do nothing.
    model_config = ConfigDict(extra="forbid")


class StudySection(_Strict):
    name: str = Field(min_length=1)
    seed: int = 0
    design: Design = "per_prompt"
    unit: Unit | None = None
    time_scale: float = Field(default=1.0, gt=0)
    #: The raw lateness (ms) the manipulation check allows a release: the proxy's own 5 ms
    #: flag by default; `flowtrial demo` raises it to a busy machine's measured timer floor
    #: and lowers ``time_scale`` so that precision × scale, the promise in the participants'
    #: time, stays the same (docs/concepts/manipulation.md#a-miss-and-the-tolerance).
    precision_ms: float = Field(default=5.0, gt=0, le=1000)
    idle_limit_s: float = Field(default=600.0, gt=0)
    #: A user-role request sooner than this after its conversation's answer ended is the
    #: agent's, not the person's (docs/concepts/turns.md#the-typing-speed-rule); 0 turns
    #: the rule off.
    typing_window_s: float = Field(default=1.0, ge=0)
    periods: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _default_unit(self) -> StudySection:
        if self.unit is None:
            self.unit = ALLOWED_UNITS[self.design][0]  # type: ignore[assignment]
        elif self.unit not in ALLOWED_UNITS[self.design]:
            allowed = " or ".join(repr(u) for u in ALLOWED_UNITS[self.design])
            raise ValueError(
                f"unit {self.unit!r} does not fit design {self.design!r}: use {allowed}"
            )
        return self


class Endpoint(_Strict):
    base_url: str
    api_key_env: str | None = None
    credentials: Credentials = "study"

    @model_validator(mode="after")
    def _check(self) -> Endpoint:
        _check_endpoint(self.base_url, self.api_key_env)
        _check_credentials(self.credentials, self.api_key_env)
        return self


def _check_credentials(credentials: str, api_key_env: str | None) -> None:
    if credentials == "study" and api_key_env is None:
        raise ValueError('needs api_key_env (the name of the variable holding the study\'s '
                         'key), or credentials = "participant" to forward each '
                         "participant's own")
    if credentials == "participant" and api_key_env is not None:
        raise ValueError('credentials = "participant" forwards each participant\'s own '
                         "credential: remove api_key_env (the study's key would never be sent)")


def _check_endpoint(base_url: str | None, api_key_env: str | None) -> None:
    if base_url is not None and not re.match(r"^https?://", base_url):
        raise ValueError("base_url must start with http:// or https://")
    if api_key_env is not None:
        if SECRET_RE.search(api_key_env):
            raise ValueError(
                "api_key_env looks like a key itself: put the *name* of the environment "
                "variable that holds the key (e.g. OPENAI_API_KEY), never the key"
            )
        if not ENV_VAR_RE.match(api_key_env):
            raise ValueError("api_key_env must be an environment variable name like OPENAI_API_KEY")


class MockSettings(_Strict):
    tokens_per_second: float = Field(default=2000.0, gt=0)
    ttft_ms: float = Field(default=20.0, ge=0)
    seed: int = 0
    # Long answers for fast arms: every prose answer N tokens, or N drawn per request from
    # [lo, hi] (deterministic for the seed). None: the corpus answer as it is.
    answer_tokens: int | tuple[int, int] | None = None
    # Scripted text answers instead of corpus ones: the k-th once the conversation holds
    # k of them (instrumentation/mock_model/script.py), e.g. to break an agent's format once.
    script: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("answer_tokens")
    @classmethod
    def _check_answer_tokens(cls, v: int | tuple[int, int] | None
                             ) -> int | tuple[int, int] | None:
        lo, hi = (v, v) if isinstance(v, int) else v if v is not None else (1, 1)
        if not 1 <= lo <= hi <= 1_000_000:
            raise ValueError("answer_tokens must be a token count N >= 1 or a range "
                             "[lo, hi] with 1 <= lo <= hi (e.g. 2000 or [1500, 3000])")
        return v

    def answer_range(self) -> tuple[int, int] | None:
        """``answer_tokens`` as a (lo, hi) range, None when unset."""
        v = self.answer_tokens
        return (v, v) if isinstance(v, int) else v


class UpstreamSection(_Strict):
    kind: UpstreamKind = "mock"
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    mock: MockSettings = MockSettings()
    # The simulated model answers a request offering tools with a harmless tool call for the
    # first N steps of each turn (an agent's multi-step turn, docs/concepts/turns.md).
    tool_steps: int = Field(default=0, ge=0, le=100)
    # Optional side-by-side endpoints: OpenAI-protocol paths go to `openai`, Anthropic
    # Messages to `anthropic` (issue: real agents speak different protocols).
    openai: Endpoint | None = None
    anthropic: Endpoint | None = None
    gemini: Endpoint | None = None
    credentials: Credentials = "study"  # for base_url (each [upstream.<family>] has its own)

    @model_validator(mode="after")
    def _check(self) -> UpstreamSection:
        _check_endpoint(self.base_url, self.api_key_env)
        named = [f for f in FAMILIES if getattr(self, f) is not None]
        if "kind" not in self.model_fields_set and (named or self.base_url is not None):
            # A study that names a real endpoint means it: never fall back to the simulated
            # model just because `kind` was left out.
            self.kind = "anthropic" if named and named[0] == "anthropic" else "openai"
        elif self.kind == "mock" and (named or self.base_url is not None):
            what = ", ".join(f"[upstream.{f}]" for f in named) or "base_url"
            raise ValueError(f'kind = "mock" (the built-in simulated model) would ignore '
                             f"{what}: remove kind, or set it to the endpoint to use")
        if self.kind != "mock" and self.tool_steps:
            raise ValueError("tool_steps drives the built-in simulated model only: remove it, "
                             'or use kind = "mock"')
        if self.kind != "mock":
            side = getattr(self, self.kind)
            if self.base_url is None and side is None:
                raise ValueError(f"kind {self.kind!r} needs base_url (and api_key_env)")
            if self.base_url is not None:
                try:
                    _check_credentials(self.credentials, self.api_key_env)
                except ValueError as exc:
                    raise ValueError(f"kind {self.kind!r} {exc}") from None
        return self

    def endpoints(self) -> dict[str, Endpoint]:
        """Family -> the endpoint serving it (``base_url`` serves ``kind``)."""
        out = {f: e for f in FAMILIES if (e := getattr(self, f)) is not None}
        if self.kind != "mock" and self.base_url is not None and self.kind not in out:
            out[self.kind] = Endpoint.model_construct(
                base_url=self.base_url, api_key_env=self.api_key_env,
                credentials=self.credentials)
        return out


class Range(_Strict):
    min: float = Field(gt=0)
    max: float = Field(gt=0)
    scale: Literal["log", "linear"] = "log"

    @model_validator(mode="after")
    def _order(self) -> Range:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


#: Delivery granularity of fast arms (docs/concepts/shaping.md#display-frames): tokens due
#: within one frame leave together in one write when the arm's token gap is shorter than a
#: frame (faster than 125 tokens/s at 8 ms); 0 = one write per token at any speed.
DEFAULT_FRAME_MS = 8.0
FrameMs = Annotated[float, Field(ge=0, le=50)]


class PerPromptSection(_Strict):
    ttft_ms: Range | None = None
    tokens_per_second: Range | None = None
    jitter: float = Field(default=0.0, ge=0)
    delivery: Delivery = "stream"
    frame_ms: FrameMs = DEFAULT_FRAME_MS


class NamedUpstream(_Strict):
    """``[upstreams.NAME]``: an upstream an arm can name (``[[arms]] upstream = "NAME"``),
    besides the study's default ``[upstream]``. A real one serves the protocols of its
    ``kind`` (openai | anthropic | gemini); ``kind = "mock"`` is a simulated model of its own
    speed (``[upstreams.NAME.mock]``) serving every protocol."""

    kind: UpstreamKind
    base_url: str | None = None
    api_key_env: str | None = None
    credentials: Credentials = "study"
    mock: MockSettings = MockSettings()

    @model_validator(mode="after")
    def _check(self) -> NamedUpstream:
        _check_endpoint(self.base_url, self.api_key_env)
        if self.kind == "mock":
            if self.base_url is not None or self.api_key_env is not None:
                raise ValueError('kind = "mock" (a simulated model) takes no base_url or '
                                 "api_key_env: remove them, or set kind to the API")
            return self
        if self.base_url is None:
            raise ValueError(f"kind {self.kind!r} needs base_url")
        _check_credentials(self.credentials, self.api_key_env)
        return self


class ArmConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    #: A named upstream (``[upstreams.NAME]``) serving this arm; None: the default
    #: ``[upstream]``.
    upstream: str | None = Field(default=None, min_length=1)
    #: The model this arm's requests are served by, replacing the one the client asked for
    #: (recorded as ``cycles.served_model``); None: the client's own.
    model: str | None = Field(default=None, min_length=1)
    ttft_ms: float | None = Field(default=None, ge=0)
    tokens_per_second: float | None = Field(default=None, gt=0)
    jitter: float = Field(default=0.0, ge=0)
    delivery: Delivery = "stream"
    frame_ms: FrameMs = DEFAULT_FRAME_MS
    weight: float = Field(default=1.0, gt=0)
    # Speed versus capability (docs/researchers/speed-vs-capability.md): another arm whose
    # *measured* latency this one delivers. A matched arm's ttft_ms / tokens_per_second are
    # the stated prior used until that arm has recorded `matched_after` cycles.
    matched_to: str | None = None
    matched_after: int = Field(default=30, ge=1)

    @property
    def shaped(self) -> bool:
        """An arm with no latency settings passes traffic through unshaped (team mode)."""
        return (
            self.ttft_ms is not None
            or self.tokens_per_second is not None
            or self.delivery == "all_at_once"
            or self.matched_to is not None
        )

    @property
    def latency(self) -> str:
        """``matched`` (another arm's measured latency), ``shaped`` (explicit targets) or
        ``natural`` (the model's own speed, unshaped)."""
        if self.matched_to is not None:
            return "matched"
        return "shaped" if self.shaped else "natural"


class CaptureSection(_Strict):
    content: ContentMode = "fingerprint"
    switch_min_away_s: float = Field(default=10.0, gt=0)
    switch_sensitivity_s: list[float] = Field(default_factory=lambda: [2.0, 10.0, 30.0])
    working_apps: list[str] = Field(default_factory=lambda: list(DEFAULT_WORKING_APPS))
    persistence_intervals_s: list[float] = Field(
        default_factory=lambda: [30.0, 120.0, 300.0, 600.0]
    )


class AnalysisSection(_Strict):
    """Settings that interpret the recorded data (the preregistered analysis)."""

    # Reading speed (tokens/s) of the idle wait: TTFT + max(0, n/tps − n/reading_tps).
    # 5.3 tokens/s is 238 words/min (Brysbaert 2019); the report adds a sensitivity row.
    reading_tps: float = Field(default=5.3, ge=1.0, le=50.0)


class ProxySection(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    # SSE keep-alive comments during injected waits longer than this (not a connection limit).
    keepalive_s: float = Field(default=5.0, gt=0)
    # Limits on every way in (docs/operators/limits.md; instrumentation/proxy/front_door.py).
    # Request line + headers: over this the proxy answers 431 at once, before parsing them.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # From connection (or the previous answer) to the end of the headers; then to the end of
    # the body: past either the proxy answers 408 and closes the connection.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    # How long a keep-alive connection may sit idle between requests before it is closed.
    idle_timeout_s: float = Field(default=30.0, gt=0)
    # Open client connections (HTTP and WebSocket); beyond it a new one gets 503 (logged).
    max_connections: int = Field(default=1000, ge=1)
    # Bytes of WebSocket messages waiting while a turn runs; beyond it the socket is closed
    # with 1008. One message over max_body_bytes (plus 64 KiB) is closed with 1009.
    ws_inbox_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # WebSockets open at once per participant (a new one beyond it is refused with 429), and
    # how long one may sit without a message before it is closed (1000).
    max_websockets_per_participant: int = Field(default=16, ge=1)
    ws_idle_timeout_s: float = Field(default=300.0, gt=0)
    # Connections that have not yet sent a whole request head, in total and per client
    # address: beyond either the *oldest* such connection is closed (408), so a flood of
    # half-open connections cannot keep a well-behaved client out.
    max_preauth_connections: int = Field(default=256, ge=1)
    max_preauth_per_client: int = Field(default=64, ge=1)
    # Uploads (event API, Continue, OTLP; instrumentation/proxy/ingest.py) are parsed in
    # worker processes, not on the event loop that releases tokens: how many processes, how
    # many uploads may wait or run at once (beyond: 503 + Retry-After), per participant (429).
    ingest_workers: int = Field(default=1, ge=1, le=16)
    ingest_queue: int = Field(default=8, ge=1)
    ingest_per_participant: int = Field(default=3, ge=1)  # an agent exports 3 signals
    # A compressed upload inflates to at most this many bytes (streamed against it: 413).
    max_inflated_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # OTLP: records (log records, spans, data points) stored from one post; the rest are
    # rejected through OTLP's partial_success.
    max_records_per_post: int = Field(default=2000, ge=1)
    # A stored string value (attribute, payload field) longer than this is cut and flagged;
    # a stored payload over max_payload_bytes keeps its first fields and is flagged.
    max_value_bytes: int = Field(default=4096, ge=64)
    max_payload_bytes: int = Field(default=64 * 1024, ge=1024)
    # Uploaded bytes stored per participant per UTC day (events' payloads): beyond it 429.
    max_stored_bytes_per_day: int = Field(default=64 * 1024 * 1024, gt=0)
    # Run the garbage collector's older generations between timed releases rather than
    # wherever they fall (instrumentation/proxy/quiet_gc.py); off = CPython's own schedule.
    quiet_gc: bool = True
    # The *name* of the variable holding the admin token (GET /flowtrial/v1/admin/...);
    # unset variable = admin endpoints disabled. Never the token itself.
    admin_token_env: str = "FLOWTRIAL_ADMIN_TOKEN"
    # The OTLP/gRPC receiver's port (agents' gRPC exporters; needs grpcio), on ``host``;
    # unset = off (OTLP/HTTP is always served on the proxy's own port). 0 picks a free one.
    otlp_grpc_port: int | None = Field(default=None, ge=0, le=65535)
    # The address participants reach the proxy at (behind TLS or a tunnel), used in the
    # settings the participant page and `flowtrial onboard` print; default http://host:port.
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")

    @property
    def base_url(self) -> str:
        """Where participants' assistants reach the proxy (no trailing slash)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @model_validator(mode="after")
    def _inbox_holds_a_message(self) -> ProxySection:
        if self.ws_inbox_bytes < self.max_body_bytes:
            raise ValueError("ws_inbox_bytes: must be >= max_body_bytes (the inbox must hold "
                             "one message of the largest size the proxy accepts)")
        return self

    @field_validator("admin_token_env")
    @classmethod
    def _check_admin_env(cls, name: str) -> str:
        if SECRET_RE.search(name):
            raise ValueError(
                "looks like a token itself: put the *name* of the environment variable that "
                "holds the admin token (e.g. FLOWTRIAL_ADMIN_TOKEN), never the token"
            )
        if not ENV_VAR_RE.match(name):
            raise ValueError("must be an environment variable name like FLOWTRIAL_ADMIN_TOKEN")
        return name


class ConsentSection(_Strict):
    """A field study's consent (docs/researchers/field-study.md): until a participant agrees
    to this text on the participant page, the proxy refuses their requests."""

    version: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1)


#: Arm keys added after studies existed -> the key whose being set brings them into the
#: randomization fingerprint.
_NEW_ARM_KEYS = {"upstream": "upstream", "model": "model", "matched_to": "matched_to",
                 "matched_after": "matched_to"}


def _check_matched(arms: list[ArmConfig]) -> None:
    """A matched arm names another arm that delivers its own latency, and states its prior."""
    by_name = {a.name: a for a in arms}
    for a in arms:
        if a.matched_to is None:
            continue
        other = by_name.get(a.matched_to)
        if other is None or other is a:
            raise ValueError(f"arms: {a.name!r} has matched_to = {a.matched_to!r}, which is not "
                             f"another arm (arms: {', '.join(by_name)})")
        if other.matched_to is not None:
            raise ValueError(f"arms: {a.name!r} is matched to {other.name!r}, which is itself "
                             "matched: match to an arm that delivers its own latency")
        if a.ttft_ms is None or a.tokens_per_second is None:
            raise ValueError(f"arms: matched arm {a.name!r} needs ttft_ms and "
                             "tokens_per_second: the stated prior it delivers until "
                             f"{a.matched_to!r} has recorded {a.matched_after} cycles")


class StudyConfig(_Strict):
    """The whole study file."""

    study: StudySection
    upstream: UpstreamSection = UpstreamSection()
    upstreams: dict[str, NamedUpstream] = Field(default_factory=dict)
    per_prompt: PerPromptSection | None = None
    arms: list[ArmConfig] = Field(default_factory=list)
    capture: CaptureSection = CaptureSection()
    analysis: AnalysisSection = AnalysisSection()
    proxy: ProxySection = ProxySection()
    questionnaire: QuestionnaireSection = QuestionnaireSection()
    consent: ConsentSection | None = None

    @model_validator(mode="after")
    def _design(self) -> StudyConfig:
        design = self.study.design
        names = [a.name for a in self.arms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"arms: duplicate arm name {dupes[0]!r}: names must be unique")
        for a in self.arms:
            if a.upstream is not None and a.upstream not in self.upstreams:
                known = ", ".join(sorted(self.upstreams)) or "none"
                raise ValueError(f"arms: arm {a.name!r} names upstream {a.upstream!r}, which "
                                 f"is not defined: add [upstreams.{a.upstream}] or fix the "
                                 f"name (defined: {known})")
        if design == "per_prompt":
            pp = self.per_prompt
            if pp is None or (pp.ttft_ms is None and pp.tokens_per_second is None):
                raise ValueError(
                    "per_prompt: design 'per_prompt' needs [per_prompt] with ttft_ms and/or "
                    "tokens_per_second ranges"
                )
        elif design == "observe" and self.arms:
            raise ValueError("arms: design 'observe' has no arms (a team's own work, no "
                             "trial): remove the [[arms]] tables")
        elif design == "parallel" and len(self.arms) < 1:
            raise ValueError("arms: design 'parallel' needs at least one [[arms]] table")
        elif design == "crossover" and len(self.arms) < 2:
            raise ValueError("arms: design 'crossover' needs at least two [[arms]] tables")
        _check_matched(self.arms)
        return self

    @property
    def arm_names(self) -> list[str]:
        return [a.name for a in self.arms]

    @property
    def allocated_arms(self) -> list[ArmConfig]:
        """The arms participants (or periods) are allocated to: none in a per-prompt study,
        where every prompt draws its own latency from ``[per_prompt]`` (its cycles carry the
        label ``per_prompt``, not an arm). Stored, exported, counted and checked for sample
        ratio are these, never ``[[arms]]`` a per-prompt study leaves unused."""
        return [] if self.study.design == "per_prompt" else list(self.arms)

    def arm(self, name: str) -> ArmConfig:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    def config_hash(self) -> str:
        """SHA-256 of the whole validated study configuration (canonical JSON): names the
        exact study a report, ``results.json`` or a release package came from."""
        canon = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

    def randomization_fingerprint(self) -> str:
        """Hash of the parts that fix who gets which latency; they must not change mid-study."""
        part = {
            "seed": self.study.seed,
            "design": self.study.design,
            "unit": self.study.unit,
            # Keys that did not exist before are left out while unset, so a study from
            # before them keeps its fingerprint.
            "arms": [{k: v for k, v in a.model_dump().items()
                      if k not in _NEW_ARM_KEYS or a.model_dump()[_NEW_ARM_KEYS[k]] is not None}
                     for a in self.arms],
            "per_prompt": self.per_prompt.model_dump() if self.per_prompt else None,
        }
        return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:16]


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's validator/union labels carry no meaning for the user
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(err: Mapping[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "greater_than":
        return f"must be > {ctx['gt']:g}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']:g}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']:g}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key (check its spelling against `flowtrial init`'s example)"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_parsing", "float_type"):
        return "must be a number"
    if kind in ("string_type",):
        return "must be a string"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        return "may contain only letters, digits, '_', '.' and '-'"
    if kind in ("list_type",):
        return "must be a list"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return "must be a table"
    if kind == "value_error":
        msg = str(err.get("msg", ""))
        return msg.removeprefix("Value error, ")
    return str(err.get("msg", kind))


def format_validation_error(exc: ValidationError) -> list[str]:
    """One line per problem, each naming the key (``arms[1].tokens_per_second: must be > 0``)."""
    lines = []
    for err in exc.errors():
        loc = _loc(tuple(err["loc"]))
        msg = _message(err)
        # Model-level validators already name their key in the message.
        lines.append(f"{loc}: {msg}" if loc and not msg.startswith(f"{loc}:") else msg)
    return lines


def parse_study(data: dict[str, Any], source: str = "study.toml") -> StudyConfig:
    """Validate a parsed study mapping; raise ConfigError listing every problem."""
    try:
        return StudyConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc), source) from None


def load_study(path: str | Path) -> StudyConfig:
    """Read and validate a study file."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            ["file not found: create one with `flowtrial init`"], str(p)
        )
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], str(p)) from None
    return parse_study(data, str(p))


def study_warnings(config: StudyConfig) -> list[str]:
    """Things in a valid study file that do nothing, one line each (naming the key).

    A per-prompt study may keep ``[[arms]]`` (the example does, ready for switching the
    design), but it does not use them: each request draws its latency from ``[per_prompt]``.
    That is a warning, not an error, so that switching ``design`` back and forth needs no
    other edit; ``flowtrial validate`` and ``flowtrial enroll`` print it.
    """
    out = []
    if config.study.design == "per_prompt" and config.arms:
        names = ", ".join(config.arm_names)
        out.append(
            f"arms: not used by design 'per_prompt' ({names}): each request draws its latency "
            "from [per_prompt]; arms apply when design is 'parallel' or 'crossover'"
        )
    return out


def _describe_contrasts(config: StudyConfig) -> list[str]:
    from .factorial import CONTRAST_MEANING, contrasts

    return [f"contrast {name}: {arm} vs {ref} estimates {CONTRAST_MEANING[name.split(':')[0]]}"
            for name, (arm, ref) in contrasts(config).items()]


def describe_study(config: StudyConfig) -> list[str]:
    """A short summary of a study's design, one line per part (``flowtrial validate``)."""

    def profile(ttft: object, tps: object, delivery: str, jitter: float) -> str:
        parts = [f"TTFT {ttft}", f"{tps} tokens/s"]
        if delivery != "stream":
            parts.append(delivery)
        if jitter:
            parts.append(f"jitter {jitter:g}")
        return ", ".join(parts)

    def rng(r: Range | None, unit: str) -> str:
        if r is None:
            return "upstream's own"
        return f"{r.min:g}–{r.max:g} {unit} ({r.scale})"

    s = config.study
    lines = [
        f"study {s.name!r}: design {s.design}, unit {s.unit}, seed {s.seed}, "
        f"time_scale {s.time_scale:g}, idle limit {s.idle_limit_s:g} s"
    ]
    if s.design == "per_prompt" and config.per_prompt is not None:
        pp = config.per_prompt
        lines.append("per prompt: " + profile(rng(pp.ttft_ms, "ms"),
                                             rng(pp.tokens_per_second, "").rstrip(),
                                             pp.delivery, pp.jitter))
    else:
        for a in config.arms:
            if a.matched_to is not None:
                desc = (f"{a.matched_to}'s measured TTFT and tokens/s (drawn per request from "
                        f"its recorded cycles once it has {a.matched_after}; before that "
                        f"{a.ttft_ms:g} ms, {a.tokens_per_second:g} tokens/s)")
            elif not a.shaped:
                desc = ("its natural speed (unshaped)" if a.model
                        else "unshaped (passes traffic through)")
            else:
                desc = profile(f"{a.ttft_ms:g} ms" if a.ttft_ms is not None else "upstream's own",
                               f"{a.tokens_per_second:g}" if a.tokens_per_second else
                               "upstream's own", a.delivery, a.jitter)
            weight = f", weight {a.weight:g}" if a.weight != 1 else ""
            route = "".join([f", upstream {a.upstream}" if a.upstream else "",
                             f", model {a.model}" if a.model else ""])
            lines.append(f"arm {a.name}: {desc}{weight}{route}")
        lines.extend(_describe_contrasts(config))
        if s.design == "crossover":
            lines.append(f"periods: {s.periods or len(config.arms)}")
    up = config.upstream
    where = {"mock": "the built-in simulated model (no key, no network)"}.get(
        up.kind, up.base_url or "")
    named = [f"[upstream.{f}] {getattr(up, f).base_url}" for f in FAMILIES
             if getattr(up, f) is not None]
    lines.append(f"upstream: {up.kind}" + (f", {where}" if where else "")
                 + "".join(f"; {n}" for n in named))
    lines.append(f"capture: content {config.capture.content}, a switch is ≥ "
                 f"{config.capture.switch_min_away_s:g} s away from the working apps")
    lines.append(f"proxy: {config.proxy.host}:{config.proxy.port}")
    return lines


def example_study_text(design: Design = "per_prompt") -> str:
    """The commented example study file that `flowtrial init` writes: per-prompt (no arms;
    the arms for the other designs are a commented block), or switched to ``design`` the way
    its comment tells a user to: design and unit set, the two example arms uncommented."""
    text = (Path(__file__).parent / "example_study.toml").read_text(encoding="utf-8")
    if design == "per_prompt":
        return text
    lines = text.splitlines(keepends=True)
    start = lines.index("# [[arms]]\n")
    end = lines.index("[capture]\n")
    lines[start:end] = [ln[2:] if ln.startswith("# ") else ln.lstrip("#")
                        for ln in lines[start:end]]
    text = "".join(lines)
    text = re.sub(r'^design = "per_prompt" *', lambda _m: f'design = "{design}"'.ljust(31),
                  text, count=1, flags=re.M)
    unit = ALLOWED_UNITS[design][0]
    return re.sub(r'^unit = "prompt" *', lambda _m: f'unit = "{unit}"'.ljust(31), text,
                  count=1, flags=re.M)


def speed_vs_capability_text() -> str:
    """`flowtrial init --template speed-vs-capability`: a fast model, the same model slowed
    to a slow model's measured latency, and the slow model (docs/researchers/
    speed-vs-capability.md)."""
    return (Path(__file__).parent / "speed_vs_capability_study.toml").read_text(
        encoding="utf-8")
