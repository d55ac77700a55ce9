"""Extensions: what the proxy serves besides the model protocols (mitmproxy's addons are the
model).

A :class:`ProxyExtension` brings routes, an OpenAPI fragment (the ``paths`` it adds to
``/flowtrial/v1/openapi.json``) and start-up/shut-down hooks run in the app's lifespan (after
the proxy's state is up; shut down before the writer closes). The composition root chooses
the set (``flowtrial/proxy_assembly.py``) and passes it to
:func:`~flowtrial.instrumentation.proxy.app.create_proxy_app`; :func:`builtin_extensions` is the
set flowtrial ships: the event API, Continue's data destination, the participant page, the
admin endpoints and the OpenAPI document. A new one (e.g. a telemetry receiver) is a class
here or beside its feature, and one entry in the root's list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from starlette.responses import Response
from starlette.routing import BaseRoute

from flowtrial.study.config import StudyConfig
from flowtrial.study.extras import available, install_hint
from flowtrial.study.storage import Database

from .events_api import accept_events
from .hooks import Call, guarded_route
from .openapi import admin_paths, continue_paths, document_paths, events_paths, openapi_routes
from .responses import json_response
from .state import ProxyState

log = logging.getLogger(__name__)

__all__ = [
    "AdminEndpoints", "AgentTelemetry", "AppContext", "ContinueDestination", "EventsApi",
    "Extension",
    "OpenApiDocument", "ParticipantPage", "Participation", "ProxyExtension", "builtin_extensions",
]


@dataclass(frozen=True)
class AppContext:
    """What an extension's routes may use: the study, its database, shared secrets, and the
    OpenAPI paths of everything the app serves."""

    database: Database
    config: StudyConfig
    page_secret: bytes | None = None
    openapi_paths: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ProxyExtension(Protocol):
    """The hook surface of one extension."""

    name: str

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        """The routes it serves (checked after the model routes)."""
        ...

    def openapi(self) -> dict[str, Any]:
        """Its entries in the OpenAPI document's ``paths``."""
        ...

    async def startup(self, state: ProxyState) -> None:
        """Run once the proxy's state is up."""
        ...

    async def shutdown(self, state: ProxyState) -> None:
        """Run at shutdown, after open cycles are recorded and before the writer closes."""
        ...


class Extension:
    """A base with no routes, no document entries and no-op hooks."""

    name = "extension"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        return []

    def openapi(self) -> dict[str, Any]:
        return {}

    async def startup(self, state: ProxyState) -> None:
        return None

    async def shutdown(self, state: ProxyState) -> None:
        return None


async def _events(call: Call) -> Response:
    """``POST /flowtrial/v1/events``: see :mod:`flowtrial.instrumentation.proxy.events_api`
    (its refusals, and ingest's 429/503, are answered by the hooks)."""
    assert call.participant is not None
    n = await accept_events(call.state, call.participant.id, call.body)
    return json_response(200, {"accepted": n})


class EventsApi(Extension):
    """``POST /flowtrial/v1/events``: decisions and context events from clients."""

    name = "events"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        return [guarded_route("/flowtrial/v1/events", _events)]

    def openapi(self) -> dict[str, Any]:
        return events_paths()


class ContinueDestination(Extension):
    """``POST /flowtrial/v1/continue``: Continue's development-data destination."""

    name = "continue"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        from ..continue_data import continue_route

        return [continue_route(ctx.database)]

    def openapi(self) -> dict[str, Any]:
        return continue_paths()


class ParticipantPage(Extension):
    """``/flowtrial/participant/``: tasks, forecasts, arm reveal, questionnaires."""

    name = "participant_page"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        from ..participant_page import participant_routes

        return participant_routes(ctx.database, ctx.config, secret=ctx.page_secret)


class Participation(Extension):
    """Keeps the proxy's view of who may be recorded current (consent, withdrawal) and writes
    the pre-consent refusal counts (:meth:`.auth.Authenticator.watch`); the activity upload
    endpoints (:mod:`..activity_upload`)."""

    name = "participation"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        from ..activity_upload import activity_routes

        return activity_routes(ctx.database, ctx.config)

    def openapi(self) -> dict[str, Any]:
        from ..activity_upload import activity_paths

        return activity_paths()

    async def startup(self, state: ProxyState) -> None:
        self._task = asyncio.create_task(state.auth.watch())

    async def shutdown(self, state: ProxyState) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(state.auth.refresh)  # the last refusal counts


class AdminEndpoints(Extension):
    """``GET /flowtrial/v1/admin/…``: read-only status for the study's admin (admin token)."""

    name = "admin"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        from .admin import admin_routes

        return admin_routes(ctx.database, ctx.config)

    def openapi(self) -> dict[str, Any]:
        return admin_paths()


class OpenApiDocument(Extension):
    """``GET /flowtrial/v1/openapi.json``: the document of everything the app serves."""

    name = "openapi"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        return openapi_routes(ctx.openapi_paths)

    def openapi(self) -> dict[str, Any]:
        return document_paths()


class AgentTelemetry(Extension):
    """Agents' own OpenTelemetry (``POST /flowtrial/otlp/v1/logs|traces|metrics``); outside
    ``/flowtrial/v1``, so not in its OpenAPI document (docs/clients/telemetry.md)."""

    name = "agent_telemetry"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        from ..telemetry.receiver import telemetry_routes

        return telemetry_routes(ctx.database, ctx.config)

    grpc_server: Any = None
    grpc_port: int | None = None

    async def startup(self, state: ProxyState) -> None:
        """The OTLP/gRPC receiver when ``proxy.otlp_grpc_port`` is set (its own threads)."""
        port = state.config.proxy.otlp_grpc_port
        if port is None:
            return
        if not available("telemetry-grpc"):
            log.warning("OTLP/gRPC receiver off: %s to serve it", install_hint("telemetry-grpc"))
            return
        from ..telemetry.grpc_receiver import serve_otlp_grpc

        self.grpc_server, self.grpc_port = serve_otlp_grpc(
            state.database, state.config, state.config.proxy.host, port, state=state,
            loop=asyncio.get_running_loop())
        log.info("OTLP/gRPC receiver on %s:%s", state.config.proxy.host, self.grpc_port)

    async def shutdown(self, state: ProxyState) -> None:
        if self.grpc_server is not None:
            self.grpc_server.stop(2).wait()


#: What the proxy says when the ``[telemetry]`` extra is missing (it serves on without it).
TELEMETRY_OFF = (f"agent telemetry (OTLP) off: {install_hint('telemetry')} to receive it "
                 "(docs/clients/telemetry.md)")


def telemetry_available() -> bool:
    """Whether the ``[telemetry]`` extra (opentelemetry-proto, protobuf) is installed."""
    return available("telemetry")


def builtin_extensions() -> list[ProxyExtension]:
    """The extensions flowtrial ships, in the order their routes are matched; the OTLP
    receiver when the ``[telemetry]`` extra is installed (without it those paths are 404 and
    the proxy's log says why)."""
    shipped: list[ProxyExtension] = [EventsApi(), ContinueDestination(), ParticipantPage(),
                                     Participation(), AdminEndpoints(), OpenApiDocument()]
    if telemetry_available():
        shipped.append(AgentTelemetry())
    else:
        log.info(TELEMETRY_OFF)
    return shipped


def telemetry_off_note(extensions: Sequence[ProxyExtension]) -> str | None:
    """The line ``flowtrial proxy`` prints when it serves no OTLP receiver because the
    ``[telemetry]`` extra is missing (None when it serves one, or left it out on purpose)."""
    if any(e.name == AgentTelemetry.name for e in extensions) or telemetry_available():
        return None
    return TELEMETRY_OFF
