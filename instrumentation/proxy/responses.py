"""The proxy's own JSON answers: errors in the protocol's shape, 401, 413, 503 (shared by the
core routes and the extensions)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from flowtrial.study.participation import Standing

from .health import RETRY_AFTER_S, UNAVAILABLE_MESSAGE
from .protocols import ProtocolAdapter, openai_error
from .state import ProxyState

__all__ = ["error", "json_response", "proxy_state", "refused", "too_large", "unauthorized",
           "unavailable"]


def json_response(status: int, body: bytes | dict[str, Any],
                  headers: dict[str, str] | None = None) -> Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Response(raw, status, headers=headers, media_type="application/json")


def error(status: int, message: str, type_: str = "invalid_request_error",
          code: str | None = None, param: str | None = None,
          adapter: ProtocolAdapter | None = None,
          headers: dict[str, str] | None = None) -> Response:
    """An error answer in ``adapter``'s protocol shape (None: OpenAI's)."""
    body = (adapter.error_body(message, type_, code, param) if adapter
            else openai_error(message, type_, code, param))
    return json_response(status, body, headers)


def unauthorized(adapter: ProtocolAdapter | None = None) -> Response:
    return error(
        401, "missing or unknown flowtrial participant key: send your own key as the API key "
             "(Authorization: Bearer ft_… or x-api-key)", "invalid_request_error",
        "invalid_api_key", adapter=adapter)


def refused(standing: Standing, adapter: ProtocolAdapter | None = None) -> Response:
    """403 for a participant who has not consented or has withdrawn (nothing is recorded)."""
    return error(403, standing.message, "permission_error", standing.code, adapter=adapter)


def too_large(limit: int, adapter: ProtocolAdapter | None = None) -> Response:
    return error(413, f"request body larger than the proxy's limit of {limit} bytes "
                      "(proxy.max_body_bytes)", code="request_too_large", adapter=adapter)


def foreign_response_message(response_id: Any) -> str:
    """A ``previous_response_id`` that is another participant's response (refused 404)."""
    return (f"Previous response with id {str(response_id)[:100]!r} not found: continue "
            "only your own responses (flowtrial refuses another participant's)")


def proxy_state(request: Request) -> ProxyState:
    return request.app.state.proxy


def unavailable(st: ProxyState, adapter: ProtocolAdapter | None = None) -> Response:
    """503 + Retry-After while the database gate is tripped (:mod:`.health`): a request the
    proxy could not record is refused rather than served. (Counted by the Counting hook.)"""
    st.recorder.gate.refused += 1
    return error(503, UNAVAILABLE_MESSAGE, "server_error", "database_unavailable", adapter=adapter,
                 headers={"retry-after": str(RETRY_AFTER_S)})
