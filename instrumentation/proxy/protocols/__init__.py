"""Wire-protocol adapters, one per protocol, looked up by proxy path."""

from __future__ import annotations

from instrumentation.proxy.protocols.base import (
    BodyInfo,
    Classified,
    Kind,
    ProtocolAdapter,
    RequestInfo,
    SSEEvent,
    SSEParser,
    openai_error,
)
from instrumentation.proxy.protocols.chat import ChatAdapter
from instrumentation.proxy.protocols.completions import CompletionsAdapter
from instrumentation.proxy.protocols.responses import ResponsesAdapter

__all__ = [
    "ADAPTERS",
    "BodyInfo",
    "ChatAdapter",
    "Classified",
    "CompletionsAdapter",
    "Kind",
    "ProtocolAdapter",
    "RequestInfo",
    "ResponsesAdapter",
    "SSEEvent",
    "SSEParser",
    "openai_error",
]

#: Proxy path -> adapter class. A later issue adds ``/v1/messages`` (Anthropic) here.
ADAPTERS: dict[str, type[ProtocolAdapter]] = {
    a.path: a for a in (ChatAdapter, CompletionsAdapter, ResponsesAdapter)
}
