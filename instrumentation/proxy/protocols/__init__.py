"""Wire-protocol adapters, one per protocol, looked up by proxy path."""

from __future__ import annotations

import re
from typing import Any

from .base import (
    BodyInfo,
    Classified,
    Family,
    JsonFrames,
    Kind,
    ProtocolAdapter,
    RequestInfo,
    SSEEvent,
    SSEParser,
    openai_error,
)
from .chat import ChatAdapter
from .checks import BadRequest, decode_json
from .completions import CompletionsAdapter
from .gemini import GeminiAdapter
from .messages import MessagesAdapter
from .responses import ResponsesAdapter, ResponsesSocketAdapter

__all__ = [
    "ADAPTERS",
    "BadRequest",
    "decode_json",
    "read_checked",
    "BY_NAME",
    "FAMILIES",
    "Family",
    "PROTOCOLS",
    "GeminiAdapter",
    "match_route",
    "read_view",
    "shape_for",
    "BodyInfo",
    "CREDENTIAL_HEADERS",
    "ChatAdapter",
    "Classified",
    "CompletionsAdapter",
    "JsonFrames",
    "Kind",
    "MessagesAdapter",
    "PLAIN_KEY_HEADERS",
    "ProtocolAdapter",
    "RequestInfo",
    "ResponsesAdapter",
    "ResponsesSocketAdapter",
    "SSEEvent",
    "SSEParser",
    "openai_error",
]

#: Every HTTP protocol; a new protocol is a module and one entry here. The Responses
#: WebSocket mode uses :class:`ResponsesSocketAdapter` on ``ws://…/v1/responses``.
PROTOCOLS: tuple[type[ProtocolAdapter], ...] = (
    ChatAdapter, CompletionsAdapter, ResponsesAdapter, MessagesAdapter, GeminiAdapter)
#: Family name (``[upstream.<name>]``) -> how its upstream is addressed.
FAMILIES: dict[str, Family] = {a.family.name: a.family for a in PROTOCOLS}
#: Headers that carry a provider credential (a participant's key, or their own under
#: pass-through), as the families declare them: never forwarded as they are to a study-key
#: upstream, never recorded. A new family's credential header is declared in its module only.
CREDENTIAL_HEADERS: tuple[str, ...] = tuple(dict.fromkeys(
    h for f in FAMILIES.values() for h in f.credential_headers))
#: The headers whose whole value is a key (not ``Authorization: Bearer …``), in that order.
PLAIN_KEY_HEADERS: tuple[str, ...] = tuple(dict.fromkeys(
    f.key_header for f in FAMILIES.values() if not f.bearer))
#: Proxy path -> adapter class, for the protocols served on fixed paths.
ADAPTERS: dict[str, type[ProtocolAdapter]] = {
    r: a for a in PROTOCOLS for r in (a.routes or (a.path,)) if "{" not in r}
#: Protocol name (as recorded in ``cycles.protocol``) -> adapter class.
BY_NAME: dict[str, type[ProtocolAdapter]] = {a.name: a for a in PROTOCOLS}


#: (compiled template, adapter class, method) for the routes with the model in the URL.
_TEMPLATES = [
    (re.compile("^" + re.escape(r).replace(re.escape("{model}"), "(?P<model>[^/]+?)") + "$"),
     a, r.rsplit(":", 1)[-1])
    for a in PROTOCOLS for r in a.routes if "{" in r
]


def match_route(path: str) -> tuple[type[ProtocolAdapter], dict[str, str]] | None:
    """The protocol serving ``path`` and its path parameters (``model``, ``method``)."""
    fixed = ADAPTERS.get(path)
    if fixed is not None:
        return fixed, {}
    for pattern, adapter, method in _TEMPLATES:
        if (m := pattern.match(path)) is not None:
            return adapter, {"model": m.group("model"), "method": method}
    return None


def shape_for(path: str) -> ProtocolAdapter | None:
    """The adapter whose error shape a reply on ``path`` takes (None: OpenAI's)."""
    for a in PROTOCOLS:
        if a.error_prefixes and path.startswith(a.error_prefixes):
            return a()
    return None


def read_view(protocol: str, body: dict[str, Any],
              url_params: dict[str, str] | None = None) -> RequestInfo:
    """The view of a request body of ``protocol`` (an unknown name reads as completions:
    the person's prompt, nothing more)."""
    adapter = BY_NAME.get(protocol, CompletionsAdapter)()
    if url_params:
        adapter.url_params = url_params
    return adapter.read_request(body)


def read_checked(protocol: str, body: dict[str, Any],
                 url_params: dict[str, str] | None = None) -> RequestInfo:
    """The view of a request a server of ``protocol`` accepts; a body its servers refuse
    raises :class:`BadRequest` (what the simulated model answers in the protocol's shape)."""
    adapter = BY_NAME[protocol]()
    if url_params:
        adapter.url_params = url_params
    try:
        adapter.validate(body)
        return adapter.read_request(body)
    except RecursionError:  # content nested deeper than the stack: the client's fault
        raise BadRequest("The request is nested too deeply.", code="invalid_value") from None
