"""OpenAI Responses over SSE: ``POST /v1/responses``.

Named events (``event:`` + ``data:``), each with a ``sequence_number``: ``response.created`` →
``response.in_progress`` → ``response.output_item.added`` → ``response.content_part.added`` →
``response.output_text.delta``* → ``…done`` events → ``response.completed`` (or
``response.incomplete`` / ``response.failed``); no ``[DONE]``.

Splitting one delta into m pieces inserts m − 1 events, so every later event's
``sequence_number`` is shifted by the running offset to keep the numbers strictly increasing
and gap-free, as clients check.

:class:`ResponsesSocketAdapter` is the same protocol in the WebSocket mode
(``ws://…/v1/responses``): each event is one JSON text message instead of an SSE block, and
errors are ``{"type": "error", "status": …, "error": {type, code, message, param}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from .base import (
    BodyInfo,
    Classified,
    Kind,
    ProtocolAdapter,
    SSEEvent,
    dumps,
    exact_obj,
    field_template,
    json_of,
    json_str,
    split_on_field,
)
from .checks import BadRequest, flag, positive_int, require_model
from .view import (
    RequestInfo,
    conversation_key,
    dicts,
    first_int,
    json_schema_of,
    loose_text,
    request_info,
    text_of_content,
    tool_spec,
)

_SEQ = re.compile(rb'"sequence_number"(\s*:\s*)(\d+)')
_TEXT_DELTAS = {"response.output_text.delta", "response.refusal.delta"}
_TOOL_DELTAS = {
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
}
_TOOL_ITEMS = {"function_call", "custom_tool_call"}
_TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
_SYSTEM = ("system", "developer")
_TOOL_RESULT_ITEMS = ("function_call_output", "custom_tool_call_output",
                      "local_shell_call_output", "computer_call_output", "mcp_approval_response")
_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")


def _role(item: Any) -> str | None:
    """The role of an input item (a bare string is the user's); None for non-messages."""
    if isinstance(item, str):
        return "user"
    if not isinstance(item, dict) or item.get("type") not in (None, "message"):
        return None
    return str(item.get("role") or "user")


def _input_text(value: Any) -> str:
    """Text of the last user input of a Responses ``input`` (string or item list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in reversed(value):
            if isinstance(item, dict) and item.get("role") == "user":
                return text_of_content(item.get("content"))
    return ""


def _seq_template(raw: bytes, tpl: tuple[bytes, bytes] | None
                  ) -> tuple[bytes, bytes, bytes, bool] | None:
    """``raw`` as ``x + SEQ + y + TEXT + z`` (True) or ``x + TEXT + y + SEQ + z`` (False),
    given its text field's (head, tail); None unless sequence_number occurs exactly once."""
    if tpl is None or len(_SEQ.findall(raw)) != 1:
        return None
    head, tail = tpl
    if (m := _SEQ.search(head)) is not None:
        return head[: m.start(2)], head[m.end(2):], tail, True
    if (m := _SEQ.search(tail)) is not None:
        return head, tail[: m.start(2)], tail[m.end(2):], False
    return None


class ResponsesAdapter(ProtocolAdapter):
    name = "responses"
    path = "/v1/responses"
    renumbers = True

    def __init__(self) -> None:
        self.offset = 0  # how many events splitting has inserted so far
        self.next_seq = 0  # the sequence number the next event we emit must carry

    def validate(self, body: dict[str, Any]) -> None:
        require_model(body)
        items = body.get("input")
        if items is not None and not isinstance(items, str | list):
            raise BadRequest("'input' must be a string or an array.", param="input")
        if body.get("instructions") is not None and not isinstance(body["instructions"],
                                                                     str | list):
            raise BadRequest("'instructions' must be a string.", param="instructions")
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise BadRequest("'previous_response_id' must be a string.",
                             param="previous_response_id")
        if isinstance(items, list) and any(not isinstance(i, dict | str) for i in items):
            raise BadRequest("Each 'input' item must be an object.", param="input")
        flag(body, "stream")
        positive_int(body, "max_output_tokens")

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        items = body.get("input")
        listed: list[Any] = [] if items is None else [items] if isinstance(items, str) else (
            items if isinstance(items, list) else [])
        previous = body.get("previous_response_id")
        previous = previous if isinstance(previous, str) else None
        system = loose_text(body.get("instructions")) + "".join(
            loose_text(i.get("content")) for i in listed if _role(i) in _SYSTEM)
        users = [i for i in listed if _role(i) == "user"]
        first_user = (users[0] if isinstance(users[0], str) else loose_text(users[0].get(
            "content"))) if users else ""
        rest = [i for i in listed if _role(i) not in _SYSTEM]
        last = rest[-1] if rest else None
        type_ = last.get("type") if isinstance(last, dict) else None
        if last is None:
            ends, how = "empty", "no_input"
        elif type_ in _TOOL_RESULT_ITEMS:
            ends, how = "tool_output", ("previous_response_tool_output" if previous and all(
                isinstance(i, dict) and i.get("type") in _TOOL_RESULT_ITEMS for i in rest)
                else type_)
        elif _role(last) == "user":
            ends, how = "user_text", "user_message"
        else:
            ends, how = "assistant", f"{type_ or _role(last)}_last"
        person = max((k for k, i in enumerate(listed) if isinstance(i, str) or (
            isinstance(i, dict) and i.get("type") in (None, "message")
            and i.get("role", "user") == "user")), default=-1)
        text = body.get("text")
        return request_info(
            body, _input_text(items), ends=ends, ends_how=f"responses:{how}",
            conversation_key=conversation_key(system, first_user) if previous is None else None,
            tools=tuple(tool_spec(t["name"], t.get("description"), t.get("parameters"))
                        for t in dicts(body.get("tools"))
                        if t.get("type") == "function" and isinstance(t.get("name"), str)),
            tool_calls_since_person=sum(1 for i in listed[person + 1:] if isinstance(i, dict)
                                        and i.get("type") in _CALL_ITEMS),
            has_person=person >= 0, previous_response_id=previous, system_text=system,
            max_tokens=first_int(body, "max_output_tokens"),
            parts=(body.get("instructions"), items),
            schema=json_schema_of(text.get("format") if isinstance(text, dict) else None))

    def model_answers(self, body: dict[str, Any]) -> list[str]:
        return [loose_text(i.get("content")) for i in dicts(body.get("input"))
                if i.get("role") == "assistant"]

    def classify(self, ev: SSEEvent) -> Classified:
        obj = json_of(ev)
        if not isinstance(obj, dict):
            return Classified(Kind.OTHER, obj=obj)
        type_ = obj.get("type") or ev.name
        if type_ in _TEXT_DELTAS:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                return Classified(Kind.CONTENT, delta, "delta", obj=obj)
            return Classified(Kind.OTHER, obj=obj)
        if type_ in _TOOL_DELTAS:
            delta = obj.get("delta")
            text = delta if isinstance(delta, str) else ""
            return Classified(Kind.TOOL, text, "delta" if text else None, obj=obj)
        if type_ == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") in _TOOL_ITEMS:
                return Classified(Kind.TOOL, tool_calls=1, obj=obj)
            return Classified(Kind.OTHER, obj=obj)
        resp = obj.get("response")
        rid = resp.get("id") if isinstance(resp, dict) and isinstance(resp.get("id"), str) else None
        if type_ in _TERMINAL:
            usage = resp.get("usage") if isinstance(resp, dict) else None
            err = None
            if type_ == "response.failed" and isinstance(resp, dict):
                err = str((resp.get("error") or {}).get("message") or "response.failed")
            return Classified(
                Kind.TERMINAL, usage=usage if isinstance(usage, dict) else None,
                response_id=rid, obj=obj, error=err,
            )
        if type_ == "error":
            msg = obj.get("message")
            if not isinstance(msg, str):
                inner = obj.get("error")
                msg = inner.get("message") if isinstance(inner, dict) else None
            return Classified(Kind.ERROR, obj=obj, error=str(msg or "error"))
        return Classified(Kind.OTHER, response_id=rid, obj=obj)

    # -- sequence numbers ------------------------------------------------------------------
    def _seq_of(self, c: Classified) -> int | None:
        seq = c.obj.get("sequence_number") if isinstance(c.obj, dict) else None
        return seq if isinstance(seq, int) else None

    def restamp(self, ev: SSEEvent, c: Classified) -> bytes:
        seq = self._seq_of(c)
        if seq is None:
            return ev.raw
        new = seq + self.offset
        self.next_seq = new + 1
        if self.offset == 0:
            return ev.raw
        return self._set_seq(ev.raw, None, ev.name, new)  # parsed exactly if needed

    def split(self, ev: SSEEvent, c: Classified, pieces: list[str]) -> Iterator[bytes]:
        seq = self._seq_of(c)
        key = c.text_key or "delta"
        if seq is None:
            out = split_on_field(ev.raw, key, c.text, pieces)
            return out if out is not None else (self._reserialize(ev, c, p) for p in pieces)
        first = seq + self.offset
        # Later events are only handled once these pieces are out, so the offset can move now.
        self.offset += len(pieces) - 1
        self.next_seq = first + len(pieces)
        tpl = _seq_template(ev.raw, field_template(ev.raw, key, c.text))
        if tpl is not None:  # the common case: both slots in one template, no regex per piece
            x, y, z, seq_first = tpl
            if seq_first:
                return (x + str(first + i).encode() + y + json_str(p) + z
                        for i, p in enumerate(pieces))
            return (x + json_str(p) + y + str(first + i).encode() + z
                    for i, p in enumerate(pieces))
        out = split_on_field(ev.raw, key, c.text, pieces)
        if out is None:
            out = (self._reserialize(ev, c, p) for p in pieces)
        return (self._set_seq(raw, None, ev.name, first + i) for i, raw in enumerate(out))

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        obj = dict(exact_obj(ev, c))
        obj["delta"] = piece
        return self._frame(ev.name or obj.get("type"), obj)

    def _frame(self, name: str | None, obj: Any) -> bytes:
        """One event on the wire (SSE here; a bare JSON message over a WebSocket)."""
        return _sse(name, obj)

    def _set_seq(self, raw: bytes, obj: Any, name: str | None, seq: int) -> bytes:
        """``raw`` with its top-level sequence_number set to ``seq`` (re-serialized if the key
        is not found exactly once)."""
        matches = _SEQ.findall(raw)
        if len(matches) == 1:
            return _SEQ.sub(lambda m: b'"sequence_number"' + m.group(1) + str(seq).encode(), raw)
        if obj is None:
            obj = self._parse(raw)
        obj = dict(obj)
        obj["sequence_number"] = seq
        return self._frame(name or obj.get("type"), obj)

    def _parse(self, raw: bytes) -> Any:
        return json.loads(raw.split(b"data:", 1)[1])

    def error_event(self, message: str, type_: str = "server_error", code: str | None = None,
                    ) -> bytes:
        obj = {"type": "error", "code": code or type_, "message": message, "param": None,
               "sequence_number": self.next_seq}
        self.next_seq += 1
        return _sse("error", obj)

    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        texts, args, tools = [], [], 0
        for item in body.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") in _TOOL_ITEMS:
                tools += 1
                a = item.get("arguments", item.get("input"))  # function / custom tool
                if isinstance(a, str):
                    args.append(a)
            elif item.get("type") == "message":
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") in ("output_text", "refusal"):
                        t = part.get("text", part.get("refusal"))
                        if isinstance(t, str):
                            texts.append(t)
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        rid = body.get("id") if isinstance(body.get("id"), str) else None
        return BodyInfo("".join(texts), tools, usage, rid, "".join(args))


def _sse(name: str | None, obj: Any) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + dumps(obj).encode() + b"\n\n"


class ResponsesSocketAdapter(ResponsesAdapter):
    """The Responses protocol over the WebSocket mode: bare JSON messages, the WS error shape.

    ``last_error_status`` is the ``status`` of the last upstream ``error`` event (a 4xx is the
    client's request being refused, not an upstream failure)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_error_status: int | None = None

    def classify(self, ev: SSEEvent) -> Classified:
        c = super().classify(ev)
        if c.kind is Kind.ERROR and isinstance(c.obj, dict):
            status = c.obj.get("status")
            self.last_error_status = status if isinstance(status, int) else None
        return c

    def _frame(self, name: str | None, obj: Any) -> bytes:
        return dumps(obj).encode()

    def _parse(self, raw: bytes) -> Any:
        return json.loads(raw)

    def keepalive(self) -> bytes:
        return b""

    def error_event(self, message: str, type_: str = "server_error", code: str | None = None,
                    ) -> bytes:
        status = {"upstream_timeout": 504, "upstream_unreachable": 502,
                  "upstream_error": 502}.get(code or "")
        return ws_error(message, type_, code, status)


#: The WebSocket mode's envelope keys of a ``response.create`` message: not part of the
#: Responses request it carries (``stream`` is implicit over a socket).
WS_ENVELOPE = ("type", "stream", "stream_id", "generate", "background")


def ws_error(message: str, type_: str = "invalid_request_error", code: str | None = None,
             status: int | None = None, param: str | None = None) -> bytes:
    """A Responses WebSocket ``error`` message (the socket stays usable after it)."""
    if status is None:
        status = 400 if type_ == "invalid_request_error" else 500
    return dumps({"type": "error", "status": status, "error": {
        "type": type_, "code": code or type_, "message": message, "param": param}}).encode()
