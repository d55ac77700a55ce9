"""Wire-protocol adapters, one per protocol, looked up by proxy path."""

from __future__ import annotations

from instrumentation.proxy.protocols.base import (
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
from instrumentation.proxy.protocols.chat import ChatAdapter
from instrumentation.proxy.protocols.completions import CompletionsAdapter
from instrumentation.proxy.protocols.messages import MessagesAdapter
from instrumentation.proxy.protocols.responses import ResponsesAdapter, ResponsesSocketAdapter

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
