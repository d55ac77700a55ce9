"""A Responses WebSocket message read: the checks of its envelope, the request's view and
input key, or the ``error`` message to send back.

This is the WebSocket side of :mod:`.body_parser`: a small message is read on the loop; a
large one (``OFF_LOOP_BYTES`` and over) in the body parser's process
(:meth:`~.body_parser.BodyParser.read_socket_message`), which returns the view without the
conversation's parts, so nothing the size of the message is parsed, re-serialised or
unpickled on the loop that releases other participants' tokens. A large message then goes
upstream as the text it came as (:attr:`SocketMessage.text`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from ..turns.followups import input_key
from .protocols import RequestInfo, read_view
from .protocols.base import dumps
from .protocols.responses import WS_ENVELOPE, ws_error

__all__ = ["SocketMessage", "read_socket_message"]

_PROTOCOL = "responses"


@dataclass(frozen=True, slots=True)
class SocketMessage:
    """One client message, read: either ``error`` (send it back, nothing else is set) or a
    ``response.create`` (a warm-up when ``warmup``)."""

    error: bytes | None = None
    warmup: bool = False
    #: The message as a dict (small messages), else None: forward :attr:`text`, the message
    #: as it came (set by the caller of a read in the parse process).
    message: dict[str, Any] | None = None
    text: str | None = None
    view: RequestInfo | None = None  # of the request without the envelope's keys
    input_key: str | None = None
    #: What the turn tracker keys repeats on: the request without the envelope (small
    #: messages), a digest of the message as it came (large ones: 10 MB stay in the process).
    request_bytes: bytes = b""

    @property
    def model(self) -> Any:
        """The ``model`` the client asked for (None when it named none)."""
        return self.message.get("model") if self.message is not None else (
            self.view.model if self.view is not None else None)


def read_socket_message(raw: str, limit: int, keep_message: bool = True) -> SocketMessage:
    """Read ``raw``; ``keep_message`` False (in the parse process): return no dict and no
    text (the caller has the text: it is not sent back), and the view without the
    conversation's parts (a few objects to unpickle, not one per item)."""
    if len(raw) > limit:
        return SocketMessage(ws_error(
            f"message larger than the proxy's limit of {limit} bytes (proxy.max_body_bytes)",
            code="request_too_large", status=413))
    try:
        message = json.loads(raw)
    except ValueError as exc:
        return SocketMessage(ws_error(f"the message is not valid JSON: {exc}",
                                      code="invalid_json"))
    except RecursionError:
        return SocketMessage(ws_error("the message is JSON nested too deeply to read",
                                      code="invalid_json"))
    if not isinstance(message, dict) or message.get("type") != "response.create":
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        return SocketMessage(ws_error(f"unsupported message type {kind!r}: send "
                                      "'response.create'", code="unsupported_type",
                                      param="type"))
    warmup = message.get("generate") is False
    if warmup and keep_message:  # relayed as is: nothing of it is read
        return SocketMessage(warmup=True, message=message)
    if warmup:
        return SocketMessage(warmup=True)
    body = {k: v for k, v in message.items() if k not in WS_ENVELOPE}
    view = read_view(_PROTOCOL, body)
    key = input_key(_PROTOCOL, body)
    if keep_message:
        return SocketMessage(message=message, view=view, input_key=key,
                             request_bytes=dumps(body).encode())
    digest = hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()
    return SocketMessage(view=replace(view, parts=(), tool_defs=None),
                         input_key=key, request_bytes=f"large:{len(raw)}:{digest}".encode())
