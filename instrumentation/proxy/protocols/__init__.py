"""Wire-protocol adapters, one per protocol, looked up by proxy path."""

from __future__ import annotations

from .base import (
    BodyInfo,
    Classified,
    JsonFrames,
    Kind,
    ProtocolAdapter,
    RequestInfo,
    SSEEvent,
    SSEParser,
    openai_error,
)
from .chat import ChatAdapter
from .completions import CompletionsAdapter
from .messages import MessagesAdapter
from .responses import ResponsesAdapter, ResponsesSocketAdapter

__all__ = [
    "ADAPTERS",
    "BodyInfo",
    "ChatAdapter",
    "Classified",
    "CompletionsAdapter",
    "JsonFrames",
    "Kind",
    "MessagesAdapter",
    "ProtocolAdapter",
    "RequestInfo",
    "ResponsesAdapter",
    "ResponsesSocketAdapter",
    "SSEEvent",
    "SSEParser",
    "openai_error",
]

#: Proxy path -> adapter class (HTTP). The Responses WebSocket mode uses
#: :class:`ResponsesSocketAdapter` on ``ws://…/v1/responses``.
ADAPTERS: dict[str, type[ProtocolAdapter]] = {
    a.path: a for a in (ChatAdapter, CompletionsAdapter, ResponsesAdapter, MessagesAdapter)
}
