"""The proxy's extension hook surface: routes, OpenAPI fragment, start-up and shut-down hooks,
chosen by whoever builds the app (the composition root passes its standard set)."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.instrumentation.proxy.extensions import (
    AppContext,
    Extension,
    OpenApiDocument,
    ProxyExtension,
    builtin_extensions,
)
from flowtrial.instrumentation.proxy.state import ProxyState
from flowtrial.proxy_assembly import standard_extensions
from tests.instrumentation.servers import run_asgi_server


class Receiver(Extension):
    """A stand-in for a new endpoint family (e.g. a telemetry receiver)."""

    name = "receiver"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        async def receive(request: Request) -> Response:
            st = request.app.state.proxy
            return JSONResponse({"study": ctx.config.study.name,
                                 "open_cycles": len(st.open_cycles)})

        return [Route("/flowtrial/v1/receiver", receive, methods=["POST"])]

    def openapi(self) -> dict[str, Any]:
        return {"/flowtrial/v1/receiver": {"post": {"operationId": "postReceiver",
                                                    "responses": {"200": {"description": "ok"}}}}}

    async def startup(self, state: ProxyState) -> None:
        self.calls.append(f"startup {state.instance}")

    async def shutdown(self, state: ProxyState) -> None:
        self.calls.append("shutdown")


def test_an_extension_adds_routes_document_entries_and_lifecycle_hooks(make_study) -> None:
    s = make_study()
    receiver = Receiver()
    assert isinstance(receiver, ProxyExtension)
    app = create_proxy_app(s.database, s.config, instance="x1",
                           extensions=[receiver, OpenApiDocument()])
    with run_asgi_server(app) as url:
        assert receiver.calls == ["startup x1"]
        r = httpx.post(url + "/flowtrial/v1/receiver")
        assert r.status_code == 200 and r.json() == {"study": s.config.study.name,
                                                     "open_cycles": 0}
        doc = httpx.get(url + "/flowtrial/v1/openapi.json").json()
        # Exactly what is served: health (the proxy's own), the receiver, the document.
        assert sorted(doc["paths"]) == ["/flowtrial/v1/health", "/flowtrial/v1/openapi.json",
                                        "/flowtrial/v1/receiver"]
        # Not given: the event API is not served (404 in the OpenAI error shape).
        r = httpx.post(url + "/flowtrial/v1/events", json={"events": []},
                       headers={"authorization": f"Bearer {s.key}"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
        # The model routes are the proxy's own, whatever the extensions.
        r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {s.key}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
    assert receiver.calls == ["startup x1", "shutdown"]


def test_the_root_serves_the_builtin_set_and_the_default_is_the_same() -> None:
    names = [e.name for e in standard_extensions()]
    assert names == [e.name for e in builtin_extensions()]
    # The [test] extra installs [all], so the OTLP receiver (the [telemetry] extra) is there.
    assert names == ["events", "continue", "participant_page", "participation", "admin",
                     "openapi", "agent_telemetry"]
