"""The simulated model over HTTP (all paths) and the Responses WebSocket mode."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .model import MockModel
from .openai_wire import dumps, ws_error

__all__ = ["create_mock_app"]


def create_mock_app(model: MockModel) -> Starlette:
    """A Starlette app serving `model`: every HTTP path via `model.respond`, plus
    `ws://…/v1/responses` (and `/responses`) in the Responses WebSocket mode."""

    async def http(request: Request) -> Response:
        body = await request.body()
        # The query goes along: Gemini's ``alt=sse`` chooses the stream's framing.
        path = request.url.path + ("?" + request.url.query if request.url.query else "")
        reply = await model.respond(request.method, path, request.headers, body)
        return StreamingResponse(reply.body, status_code=reply.status, headers=reply.headers)

    async def responses_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                frame = await websocket.receive()
                if frame["type"] == "websocket.disconnect":
                    return
                raw = frame.get("text")
                if raw is None:
                    raw = (frame.get("bytes") or b"").decode("utf-8", "replace")
                try:
                    message = json.loads(raw)
                except ValueError as exc:
                    await websocket.send_text(dumps(ws_error(f"Invalid JSON: {exc}")))
                    continue
                # One turn at a time per connection, as the API does.
                async for event in model.respond_ws(message, websocket.headers):
                    await websocket.send_text(dumps(event))
        except WebSocketDisconnect:
            return

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(
        routes=[
            WebSocketRoute("/v1/responses", responses_socket),
            WebSocketRoute("/responses", responses_socket),
            Route("/{path:path}", http, methods=methods),
        ]
    )
