"""What every wire-protocol adapter provides, plus the incremental SSE parser they share.

An adapter knows one protocol's shapes and nothing about timing: it reads the request
(stream flag, model, prompt text), classifies each upstream event (content / tool-call /
terminal / error / other, with its text, usage and response id), splits a content event into
token-sized *whole* events by rewriting only its text field, and renders keep-alives and
errors in the protocol's own shape. The relay (``relay.py``) does the rest.

Anthropic Messages (``messages.py``: named events, ``ping`` keep-alives,
``{"type": "error", ...}``) and the Responses WebSocket mode (``ResponsesSocketAdapter``:
JSON messages instead of SSE blocks, :class:`JsonFrames`) are further subclasses: everything
a transport needs is a method here (``keepalive``, ``error_event``, ``error_body``,
``restamp``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from .view import RequestInfo, ToolSpec, dicts, loose_text, text_of_content

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is in the [proxy] extra
    _orjson = None  # type: ignore[assignment]

__all__ = [
    "OPENAI",
    "BodyInfo",
    "Classified",
    "Family",
    "JsonFrames",
    "Kind",
    "ProtocolAdapter",
    "RequestInfo",
    "SSEEvent",
    "SSEParser",
    "ToolSpec",
    "dumps",
    "field_template",
    "json_str",
    "split_on_field",
    "text_of_content",
]


class Kind(IntEnum):
    """What an upstream event is, as far as shaping and recording care."""

    OTHER = 0  # structure (created, role-only chunk, done events, usage): sent on arrival
    CONTENT = 1  # carries answer text: paced
    TOOL = 2  # starts a tool call or carries its arguments: counted, sent on arrival
    TERMINAL = 3  # the final event: released only once the cycle row is durable
    ERROR = 4  # an in-stream error from the upstream: passed on, cycle marked


def dumps(obj: Any) -> str:
    """Compact JSON the way OpenAI's servers write it (UTF-8, no spaces)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class SSEEvent:
    """One server-sent event: its exact bytes (terminator included) and parsed fields."""

    raw: bytes
    name: str | None = None  # the `event:` field
    data: str | None = None  # the `data:` lines joined with "\n"; None for comment-only blocks


class SSEParser:
    """Cuts a byte stream into SSE events, keeping each event's exact bytes.

    The separator (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``) is detected on the first event and
    then reused, so the common case is one ``bytes.find`` per event.
    """

    __slots__ = ("_buf", "_sep")

    def __init__(self) -> None:
        self._buf = b""
        self._sep: bytes | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return list(self.iter_feed(chunk))

    def iter_feed(self, chunk: bytes) -> Iterator[SSEEvent]:
        """The events ``chunk`` completes, made one by one as they are taken; the next
        ``feed`` / ``iter_feed`` / ``flush`` must wait until this one is exhausted."""
        buf = self._buf + chunk if self._buf else chunk
        self._buf = b""
        start = 0
        sep = self._sep
        if sep is None:
            found = [(i, s) for s in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buf.find(s)) >= 0]
            if not found:
                self._buf = buf
                return
            sep = self._sep = min(found)[1]
        n = len(sep)
        while True:
            i = buf.find(sep, start)
            if i < 0:
                break
            end = i + n
            yield _parse_block(buf[start:end], buf[start:i])
            start = end
        self._buf = buf[start:]

    def flush(self) -> list[SSEEvent]:
        """An unterminated last event at end of stream (some servers omit the blank line)."""
        rest, self._buf = self._buf, b""
        if not rest.strip():
            return []
        return [_parse_block(rest + b"\n\n", rest)]


class JsonFrames:
    """The WebSocket counterpart of :class:`SSEParser`: every chunk is one whole JSON message
    (a text frame), kept as the event's exact bytes; ``name`` is left to the adapter."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return [SSEEvent(chunk, None, chunk.decode("utf-8", "replace"))]

    def iter_feed(self, chunk: bytes) -> Iterator[SSEEvent]:
        return iter(self.feed(chunk))

    def flush(self) -> list[SSEEvent]:
        return []


def _parse_block(raw: bytes, body: bytes) -> SSEEvent:
    # Fast path: a single `data: ...` line, which is what almost every chunk is.
    if body.startswith(b"data: ") and b"\n" not in body and b"\r" not in body:
        return SSEEvent(raw, None, body[6:].decode("utf-8", "replace"))
    name: str | None = None
    data: list[str] = []
    for line in body.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n").split(
        "\n"
    ):
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    return SSEEvent(raw, name, "\n".join(data) if data else None)


@dataclass(slots=True)
class Classified:
    """An upstream event, classified by the protocol adapter."""

    kind: Kind
    text: str = ""  # answer text or tool-call arguments carried by the event
    text_key: str | None = None  # JSON key holding ``text`` when the event may be split
    tool_calls: int = 0  # tool calls this event starts
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    obj: Any = None  # the parsed JSON of the event
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Family:
    """How an upstream of one API family is addressed: the proxy path → the upstream's
    (the OpenAI SDKs' base URL carries ``/v1``, Anthropic's and Google's do not), the header
    its key goes in, and headers it needs by default. :class:`HttpUpstream` reads only this,
    so a new family is a new instance in its protocol module."""

    name: str  # openai | anthropic | gemini: the ``[upstream.<name>]`` table
    key_header: str
    bearer: bool = False
    strip_version: bool = False
    default_headers: tuple[tuple[str, str], ...] = ()
    #: Other client headers that carry this family's credential (e.g. Azure OpenAI's
    #: ``api-key``): with ``key_header`` they are never recorded, and dropped or replaced
    #: upstream (``protocols.CREDENTIAL_HEADERS`` gathers them from every family).
    other_key_headers: tuple[str, ...] = ()

    @property
    def credential_headers(self) -> tuple[str, ...]:
        """Every client header that carries this family's credential."""
        return (self.key_header, *self.other_key_headers)

    def upstream_path(self, path: str) -> str:
        return path[3:] if self.strip_version and path.startswith("/v1/") else path

    def auth_headers(self, key: str) -> dict[str, str]:
        return {self.key_header: f"Bearer {key}" if self.bearer else key}


OPENAI = Family("openai", "authorization", bearer=True, strip_version=True,
                other_key_headers=("api-key",))


@dataclass(slots=True)
class BodyInfo:
    """What the proxy records of a non-streaming answer."""

    text: str
    tool_calls: int
    usage: dict[str, Any] | None
    response_id: str | None
    #: Tool-call arguments as sent (JSON text): output tokens like the text (``tokens_sent``
    #: counts both, as a stream's argument deltas are counted).
    tool_args: str = ""


#: 19+ digits in a row: a number orjson may read differently (it turns integers beyond 64
#: bits into floats where ``json`` keeps them exact).
_LONG_NUMBER = re.compile(r"\d{19}")


def loads(text: str) -> Any:
    """``json.loads(text)``, through orjson (~3x faster on a stream chunk: one parse per
    upstream event): what orjson refuses (NaN, lone surrogates, not JSON) is parsed by
    ``json`` as before. The one difference, an integer beyond 64 bits read as a float, is
    never re-serialized (:func:`exact_obj`) and only matters to recorded usage counts."""
    if _orjson is None:
        return json.loads(text)
    try:
        return _orjson.loads(text)
    except _orjson.JSONDecodeError:
        return json.loads(text)


def exact_obj(ev: SSEEvent, c: Classified) -> Any:
    """The event's JSON for re-serializing it: ``c.obj``, or ``json``'s own reading when the
    event has a number :func:`loads` may have read through orjson differently (so a split or
    renumbered event never changes a number)."""
    if ev.data is not None and _LONG_NUMBER.search(ev.data) is not None:
        return json.loads(ev.data)
    return c.obj


def json_of(ev: SSEEvent) -> Any:
    """The event's decoded JSON (None when it has no data or the data is not JSON)."""
    if ev.data is None:
        return None
    try:
        return loads(ev.data)
    except ValueError:
        return None


def openai_error_message(obj: dict[str, Any]) -> str:
    """The message of an OpenAI ``{"error": ...}`` object (or the whole object as text)."""
    err = obj.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return str(err)


def field_template(raw: bytes, key: str, value: str) -> tuple[bytes, bytes] | None:
    """(head, tail) around the JSON string value of field ``key`` (= ``value``) in the event
    ``raw``, so ``head + json(piece) + tail`` is the same event carrying ``piece`` with every
    other byte untouched. None when the field cannot be found exactly once in the encodings
    servers use (the caller then re-serializes the parsed object)."""
    kb = b'"' + key.encode() + b'"'
    for enc in {json.dumps(value, ensure_ascii=False), json.dumps(value)}:
        eb = enc.encode()
        for colon in (b":", b": "):
            needle = kb + colon + eb
            i = raw.find(needle)
            if i < 0 or raw.find(needle, i + 1) >= 0:
                continue
            return raw[: i + len(kb) + len(colon)], raw[i + len(needle) :]
    return None


def split_on_field(raw: bytes, key: str, value: str, pieces: Iterable[str]
                   ) -> Iterator[bytes] | None:
    """Copies of ``raw`` carrying each piece in field ``key``, rendered lazily (one at a time,
    as the shaper releases them); None if the field cannot be located (see field_template)."""
    tpl = field_template(raw, key, value)
    if tpl is None:
        return None
    head, tail = tpl
    return (head + json_str(p) + tail for p in pieces)


def json_str(s: str) -> bytes:
    """``s`` as a JSON string literal (UTF-8, as the templates of split events carry it)."""
    return json.dumps(s, ensure_ascii=False).encode()


class ProtocolAdapter:
    """One wire protocol. A fresh instance serves one exchange (it may keep stream state)."""

    name: ClassVar[str]  # recorded as the cycle's protocol: chat | completions | responses
    path: ClassVar[str]  # the proxy path, e.g. "/v1/chat/completions"
    #: Every path it serves; ``{model}`` stands for a model named in the URL (Gemini).
    routes: ClassVar[tuple[str, ...]] = ()
    family: ClassVar[Family] = OPENAI  # which upstream serves it and how it is addressed
    #: Paths whose errors (404, 405, 503 …) take this protocol's shape (default: OpenAI's).
    error_prefixes: ClassVar[tuple[str, ...]] = ()
    #: The path parameters of the request's route (``model``, ``method``), set by the route.
    url_params: dict[str, str] = {}  # noqa: RUF012 - replaced per instance, never mutated
    #: Whether splitting an event changes later events (Responses' sequence_number).
    renumbers: ClassVar[bool] = False

    # -- request -----------------------------------------------------------------------
    def validate(self, body: dict[str, Any]) -> None:
        """Refuse a body the protocol's servers refuse (:class:`~.checks.BadRequest`, in their
        words); the proxy leaves that to its upstream, the simulated model calls it."""

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        """The request's view (:class:`RequestInfo`); ``url_params`` may add to the body."""
        raise NotImplementedError

    def model_answers(self, body: dict[str, Any]) -> list[str]:
        """The texts of the model's earlier answers the request carries (its conversation's
        assistant turns), read only on demand (the simulated model's scripts)."""
        return [loose_text(m.get("content")) for m in dicts(body.get("messages"))
                if m.get("role") == "assistant"]

    def upstream_path(self, path: str, query: str) -> str:
        """The path (and query) the upstream is asked, for the client's ``path``."""
        return path + ("?" + query if query else "")

    def with_model(self, path: str, body: bytes, model: str) -> tuple[str, bytes]:
        """The request's path and body asking for ``model`` instead (an arm's model): the
        body's ``model`` field here; Gemini's is in the URL."""
        obj = json.loads(body)
        obj["model"] = model
        return path, dumps(obj).encode()

    def complete_at_eof(self) -> bool:
        """Whether a stream that ended without a terminal event is complete all the same."""
        return False

    # -- streaming -----------------------------------------------------------------------
    def classify(self, ev: SSEEvent) -> Classified:
        raise NotImplementedError

    def split(self, ev: SSEEvent, c: Classified, pieces: list[str]) -> Iterator[bytes]:
        """Whole events, one per piece of ``c.text``, in order, rendered as they are consumed
        (default: rewrite the text field only)."""
        assert c.text_key is not None
        out = split_on_field(ev.raw, c.text_key, c.text, pieces)
        if out is None:
            out = (self._reserialize(ev, c, p) for p in pieces)
        return out

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        """Fallback split: the parsed event with its text field set to ``piece``."""
        raise NotImplementedError

    def restamp(self, ev: SSEEvent, c: Classified) -> bytes:
        """The bytes to send for an event that was not split (renumbered if needed)."""
        return ev.raw

    def keepalive(self) -> bytes:
        """Bytes that keep a stream alive during an injected wait without being an event."""
        return b": keep-alive\n\n"

    def error_event(self, message: str, type_: str = "server_error", code: str | None = None,
                    ) -> bytes:
        """An in-stream error event in the protocol's shape."""
        return b"data: " + self.error_body(message, type_, code) + b"\n\n"

    # -- non-streaming -------------------------------------------------------------------
    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        raise NotImplementedError

    # -- errors --------------------------------------------------------------------------
    def error_body(self, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> bytes:
        """A JSON error body in the protocol's shape (OpenAI by default)."""
        return openai_error(message, type_, code, param)

    # -- usage ---------------------------------------------------------------------------
    @staticmethod
    def usage_counts(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
        """(prompt tokens, completion tokens) from any OpenAI/Anthropic/Gemini usage object."""
        if not isinstance(usage, dict):
            return None, None
        prompt = usage.get("prompt_tokens", usage.get("input_tokens",
                                                      usage.get("promptTokenCount")))
        completion = usage.get("completion_tokens", usage.get("output_tokens",
                                                              usage.get("candidatesTokenCount")))
        return (
            prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None,
        )


def openai_error(message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> bytes:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    ).encode()


class OpenAIChunkAdapter(ProtocolAdapter):
    """Chat and legacy Completions share their stream framing: ``data:`` chunks with an
    ``id``, optional ``usage`` or ``error``, and ``choices``, ended by ``[DONE]``."""

    def classify(self, ev: SSEEvent) -> Classified:
        if ev.data is not None and ev.data.startswith("[DONE]"):
            return Classified(Kind.TERMINAL)
        obj = json_of(ev)
        if not isinstance(obj, dict):
            return Classified(Kind.OTHER, obj=obj)
        rid = obj.get("id") if isinstance(obj.get("id"), str) else None
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        if obj.get("error"):
            return Classified(Kind.ERROR, obj=obj, error=openai_error_message(obj), response_id=rid)
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return Classified(Kind.OTHER, usage=usage, response_id=rid, obj=obj)
        return self.classify_choices(choices, usage, rid, obj)

    def classify_choices(
        self, choices: list[Any], usage: dict[str, Any] | None, rid: str | None,
        obj: dict[str, Any],
    ) -> Classified:
        """Classify a chunk that has choices (the part that differs between the two)."""
        raise NotImplementedError
