"""Which upstream serves a request: the study's ``[upstream]`` per API family, the named
``[upstreams.NAME]`` an arm chooses, and the model the arm has it serve (``[[arms]]
upstream`` / ``model``; docs/researchers/study-file.md#arms-on-different-models). The
upstreams themselves (the simulated model, a real API over HTTP) are in :mod:`.upstream`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flowtrial.study.config import StudyConfig

from .protocols import FAMILIES
from .upstream import HttpUpstream, MockUpstream, Upstream

__all__ = ["Route", "UpstreamRouter", "missing_key_vars"]


def missing_key_vars(config: StudyConfig) -> list[str]:
    """Names of the key variables the study's real upstreams need but the environment lacks
    (only names: the keys themselves are never read here)."""
    up = config.upstream
    names = [up.api_key_env] + [e.api_key_env for e in up.endpoints().values()] + [
        u.api_key_env for u in config.upstreams.values()]
    out: list[str] = []
    for name in names:
        if name and not os.environ.get(name) and name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class Route:
    """Where one request goes: the upstream, and the model it is asked for (None: the
    client's own)."""

    upstream: Upstream | None
    model: str | None = None
    why: str = ""  # when ``upstream`` is None: what is missing


class UpstreamRouter:
    """Which upstream serves which protocol family (``[upstream]``), and which named
    upstream and model each arm uses (``[upstreams.NAME]``, ``[[arms]] upstream/model``)."""

    def __init__(self, by_family: dict[str, Upstream],
                 named: dict[str, tuple[str, Upstream]] | None = None,
                 arms: dict[str, tuple[str | None, str | None]] | None = None) -> None:
        self.by_family = by_family
        self.named = named or {}  # name -> (kind, upstream)
        self.arms = arms or {}  # arm -> (upstream name, model)

    @classmethod
    def from_config(cls, config: StudyConfig) -> UpstreamRouter:
        up = config.upstream
        arms = {a.name: (a.upstream, a.model) for a in config.arms
                if a.upstream is not None or a.model is not None}
        named: dict[str, tuple[str, Upstream]] = {
            name: (u.kind, _build(u.kind, u.base_url, u.api_key_env, u.credentials, up, u.mock,
                                  label=name))
            for name, u in config.upstreams.items()}
        if up.kind == "mock":
            mock = _build("mock", None, None, "study", up, up.mock)
            return cls(dict.fromkeys(FAMILIES, mock), named, arms)
        return cls({family: _build(family, e.base_url, e.api_key_env, e.credentials, up)
                    for family, e in up.endpoints().items()}, named, arms)

    def for_family(self, family: str) -> Upstream | None:
        return self.by_family.get(family)

    def route(self, arm: str, family: str) -> Route:
        """The upstream and model for a request of ``family`` in ``arm``."""
        name, model = self.arms.get(arm, (None, None))
        if name is None:
            up = self.by_family.get(family)
            return Route(up, model, "" if up else f"add [upstream.{family}] to the study file")
        kind, up = self.named[name]
        if kind not in ("mock", family):
            return Route(None, model, f"arm {arm!r} uses [upstreams.{name}], a {kind} API, "
                                      f"which does not serve this {family} request")
        return Route(up, model)

    def _all(self) -> set[Upstream]:
        return set(self.by_family.values()) | {u for _, u in self.named.values()}

    async def start(self) -> None:
        for u in self._all():
            await u.start()

    async def stop(self) -> None:
        for u in self._all():
            await u.stop()


def _build(kind: str, base_url: str | None, api_key_env: str | None, credentials: str,
           up: Any, mock: Any = None, label: str | None = None) -> Upstream:
    """One upstream: the simulated model (``mock`` settings; the study's ``tool_steps``) or
    a real API of family ``kind``."""
    if kind == "mock":
        out: Upstream = MockUpstream(tokens_per_second=mock.tokens_per_second,
                                     ttft_ms=mock.ttft_ms, seed=mock.seed,
                                     tool_steps=up.tool_steps, answer_tokens=mock.answer_range(),
                                     script=tuple(mock.script))
        if label:
            out.name = f"mock:{label}"
        return out
    assert base_url is not None
    return HttpUpstream(base_url, api_key_env, family=kind, timeout_s=up.timeout_s,
                        connect_timeout_s=up.connect_timeout_s, credentials=credentials,
                        label=f"{label}:{kind}" if label else None)
