"""Per-request concerns as one list of hooks (:mod:`flowtrial.instrumentation.proxy.hooks`): a
route added the documented way — ``guarded_route`` in an extension — gets authentication,
consent, the body limit, counting, the database gate and protocol-shaped errors without
writing any of them, and the shipped routes run the same list."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.exc import OperationalError
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from flowtrial.instrumentation.aw_sync import POLICY_PATH, UPLOAD_PATH
from flowtrial.instrumentation.proxy import hooks
from flowtrial.instrumentation.proxy.app import create_proxy_app
from flowtrial.instrumentation.proxy.extensions import AppContext, Extension
from flowtrial.instrumentation.proxy.hooks import Call, Refusal, guarded_route
from flowtrial.instrumentation.proxy.protocols import MessagesAdapter
from flowtrial.instrumentation.proxy.responses import json_response
from flowtrial.instrumentation.proxy.upstream import UpstreamError
from flowtrial.study.participation import withdraw
from tests.instrumentation.servers import run_asgi_server

LIMIT = 4096


async def thing(call: Call) -> Response:
    """A new way in: it only does its own work (or fails the way the body asks)."""
    assert call.participant is not None
    failing = {b"timeout": UpstreamError(504, "the upstream did not answer in 1 s"),
               b"refuse": Refusal(422, "not a thing: send a thing", "not_a_thing", "thing"),
               b"bug": RuntimeError("a bug with a secret ft_abc in its message"),
               b"db": OperationalError("SELECT 1", {}, Exception("disk I/O error"))}
    if call.body in failing:
        raise failing[call.body]
    return json_response(200, {"participant": call.participant.id, "bytes": len(call.body)})


class Things(Extension):
    name = "things"

    def routes(self, ctx: AppContext) -> list[BaseRoute]:
        return [guarded_route("/flowtrial/v1/things", thing),  # OpenAI's error shape
                guarded_route("/flowtrial/v1/anthropic-things", thing, adapter=MessagesAdapter)]


def _counts(url: str) -> tuple[int, int]:
    h = httpx.get(url + "/flowtrial/v1/health").json()
    return h["requests"], h["errors"]


def test_a_new_route_gets_auth_limits_counting_and_protocol_shaped_errors(make_study: Any
                                                                          ) -> None:
    s = make_study({"proxy": {"max_body_bytes": LIMIT}}, participants=("p01", "p02"))
    app = create_proxy_app(s.database, s.config, extensions=[Things()])
    key = {"authorization": f"Bearer {s.keys['p01']}"}
    with run_asgi_server(app) as url:
        post = lambda body, headers=key, path="/flowtrial/v1/things": httpx.post(  # noqa: E731
            url + path, content=body, headers=headers)
        r = post(b"hello")
        assert r.status_code == 200 and r.json() == {"participant": "p01", "bytes": 5}
        requests0, errors0 = _counts(url)

        # Authentication: no key, an unknown key (OpenAI's shape; Anthropic's where asked).
        r = post(b"x", {})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = post(b"x", {"x-api-key": "ft_not_a_key"}, "/flowtrial/v1/anthropic-things")
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"  # Anthropic's own type
        # The body limit: 413 naming the setting, by Content-Length and when streamed.
        r = post(b"a" * (LIMIT + 1))
        assert r.status_code == 413 and "proxy.max_body_bytes" in r.json()["error"]["message"]
        r = post(iter([b"a" * 1024] * 8))  # chunked: no Content-Length to refuse by
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        # Error mapping: upstream timeout, a refusal naming its field, a bug (no traceback).
        r = post(b"timeout")
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
        r = post(b"refuse", path="/flowtrial/v1/anthropic-things")
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("not a thing")
        r = post(b"refuse")
        assert r.json()["error"]["param"] == "thing"
        r = post(b"bug")
        assert r.status_code == 500 and r.json()["error"]["code"] == "proxy_error"
        assert "ft_abc" not in r.text and "Traceback" not in r.text
        # Consent: a withdrawn participant is refused once the proxy has re-read who is.
        withdraw(s.database, "p02")
        app.state.proxy.auth.refresh()
        r = post(b"x", {"authorization": f"Bearer {s.keys['p02']}"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        # Counting: every request counted, every refusal an error; nothing written by hand.
        requests1, errors1 = _counts(url)
        assert (requests1 - requests0, errors1 - errors0) == (9, 9)
        # Recording: a failed database read trips the gate (its probe reopens it once the
        # database answers, here at once) and is answered 503 + Retry-After.
        r = post(b"db")
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "database_unavailable"
        assert app.state.proxy.recorder.gate.trips == 1


def test_every_shipped_way_in_runs_the_one_list(make_study: Any) -> None:
    """The model routes, token counts, model lists, the event API and activity uploads are
    guarded endpoints running the same HOOKS, in the documented order."""
    assert [h.name for h in hooks.HOOKS] == ["counting", "recording", "authentication",
                                            "body_limit", "error_mapping"]
    s = make_study()
    app = create_proxy_app(s.database, s.config)
    guarded = {r.path for r in app.routes
               if isinstance(r, Route) and getattr(r.endpoint, "hooks", None) is hooks.HOOKS}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
            "/v1/messages/count_tokens", "/v1beta/models/{model}:countTokens", "/v1/models",
            "/v1beta/models", "/flowtrial/v1/events", "/flowtrial/v1/continue", POLICY_PATH,
            UPLOAD_PATH} <= guarded


#: Routes the app serves outside HOOKS, each for a reason (a new one must be added here, with
#: its reason, or be guarded: the test below enumerates every route). ``*``: a prefix.
NOT_PARTICIPANT_API = {
    "/": "a GET landing line: no key, no body, nothing recorded",
    "/flowtrial/v1/health": "public liveness: must answer while the database is down",
    "/flowtrial/v1/openapi.json": "the public API document",
    "/flowtrial/v1/admin/*": "the admin token (admin.py), not a participant's key",
    "/flowtrial/participant*": "browser pages: session cookie + CSRF, login limited per "
                              "address, HTML answers",
}


def test_every_route_the_app_serves_is_guarded_or_named(make_study: Any) -> None:
    """Every route of the app with every shipped extension: the participant's ways in run
    HOOKS (or, OTLP, the one export that does the same for HTTP and gRPC); the rest are
    named above with their reason. The Responses WebSocket is served before routing; its
    handshake runs HOOKS too (the test below)."""
    from flowtrial.instrumentation.proxy.extensions import builtin_extensions
    from flowtrial.instrumentation.telemetry.receiver import OtlpReceiver

    s = make_study()
    app = create_proxy_app(s.database, s.config, extensions=builtin_extensions())
    routes = [r for r in app.routes if isinstance(r, Route)]
    assert len(routes) == len(app.routes)  # no Mount or WebSocketRoute hides another list
    otlp = {r.path for r in routes if isinstance(getattr(r.endpoint, "otlp", None),
                                                 OtlpReceiver)}
    assert otlp == {f"/flowtrial/otlp/v1/{x}" for x in ("logs", "traces", "metrics")}
    guarded = {r.path for r in routes if getattr(r.endpoint, "hooks", None) is hooks.HOOKS}
    rest = {r.path for r in routes} - guarded - otlp
    unnamed = {p for p in rest if not any(
        p == k or (k.endswith("*") and p.startswith(k[:-1])) for k in NOT_PARTICIPANT_API)}
    assert not unnamed, f"routes neither guarded nor named with a reason: {unnamed}"


class _Spy(hooks.RequestHook):
    """Sees every call; refuses one whose key is p02's (a hook added to the list)."""

    name = "spy"

    def __init__(self, refused_key: str) -> None:
        self.paths: list[str] = []
        self.refused_key = refused_key

    async def admit(self, call: Call) -> Response | None:
        self.paths.append(call.request.url.path)
        if self.refused_key in call.request.headers.get("authorization", ""):
            return call.error(418, "the spy refuses this one", code="spied")
        return None


def test_the_responses_websocket_handshake_runs_the_one_list(make_study: Any,
                                                              monkeypatch: Any) -> None:
    """``ws://…/v1/responses`` is served before routing, but its handshake runs HOOKS: a
    hook added to the list refuses it in OpenAI's shape, counting counts it, consent holds,
    and the per-participant cap answers 429 through the same error shape."""
    import asyncio
    import json

    import websockets
    from websockets.asyncio.client import connect

    from flowtrial.instrumentation.proxy import websocket

    s = make_study({"proxy": {"max_websockets_per_participant": 1}},
                   participants=("p01", "p02", "p03"))
    spy = _Spy(s.keys["p02"])
    monkeypatch.setattr(websocket, "HOOKS", (*hooks.HOOKS[:-1], spy, hooks.HOOKS[-1]))
    app = create_proxy_app(s.database, s.config)

    async def handshake(ws_url: str, who: str, hold: bool = False) -> tuple[int, str]:
        headers = {"authorization": f"Bearer {s.keys[who]}"}
        try:
            async with connect(ws_url, additional_headers=headers):
                if hold:  # a second socket of the same participant, while this one is open
                    return await handshake(ws_url, who)
                return 101, ""
        except websockets.InvalidStatus as exc:
            body = json.loads(exc.response.body)["error"]
            return exc.response.status_code, body["code"]

    with run_asgi_server(app) as url:
        ws_url = url.replace("http://", "ws://") + "/v1/responses"
        requests0, errors0 = _counts(url)
        assert asyncio.run(handshake(ws_url, "p01")) == (101, "")
        assert asyncio.run(handshake(ws_url, "p02")) == (418, "spied")
        assert asyncio.run(handshake(ws_url, "p01", hold=True)) == (429, "too_many_websockets")
        withdraw(s.database, "p03")
        app.state.proxy.auth.refresh()
        assert asyncio.run(handshake(ws_url, "p03"))[0] == 403
        requests1, errors1 = _counts(url)
    assert spy.paths.count("/v1/responses") == 4  # p03 stops at authentication, before it
    assert (requests1 - requests0, errors1 - errors0) == (5, 3)
