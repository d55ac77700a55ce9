"""Google's Gemini API (``generativelanguage``): ``POST /v1beta/models/{model}:generateContent``
and ``:streamGenerateContent``.

The model and the stream flag are in the URL, not the body; the key arrives as
``x-goog-api-key`` or ``?key=`` (never passed upstream in the query: the proxy sends the
study's key, or the participant's own under pass-through credentials, as ``x-goog-api-key``).
``?alt=sse`` streams ``data: {GenerateContentResponse}`` chunks; without it the stream is one
JSON array written piece by piece (:meth:`GeminiAdapter.upstream_path` always asks the
upstream for SSE, and :class:`~flowtrial.instrumentation.proxy.relay.HttpBody` writes the
array back). There is no final event: the last chunk carries ``finishReason`` (and usually
text), so a stream that ended after one is complete (:meth:`complete_at_eof`).

A chunk's answer text is ``candidates[0].content.parts[*].text`` (``thought`` parts are
reasoning: passed on arrival); a ``functionCall`` part is a whole tool call (Gemini never
streams arguments). Usage is ``usageMetadata`` (``promptTokenCount``,
``candidatesTokenCount``). Errors are ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import parse_qsl, quote, urlencode

from .base import (
    BodyInfo,
    Classified,
    Family,
    Kind,
    ProtocolAdapter,
    SSEEvent,
    dumps,
    exact_obj,
    json_of,
)
from .checks import BadRequest, stops_or_none
from .view import (
    Ends,
    RequestInfo,
    ToolSpec,
    conversation_key,
    dicts,
    tool_spec,
)

__all__ = ["GEMINI", "GeminiAdapter", "gemini_error", "google_status"]

GEMINI = Family("gemini", "x-goog-api-key")

#: The proxy's error code (or OpenAI-style type) -> (HTTP status, Google's status name).
_STATUS = {
    "invalid_api_key": (401, "UNAUTHENTICATED"),
    "no_assignment": (403, "PERMISSION_DENIED"),
    "unknown_url": (404, "NOT_FOUND"),
    "method_not_allowed": (405, "UNIMPLEMENTED"),
    "request_too_large": (413, "INVALID_ARGUMENT"),
    "upstream_timeout": (504, "DEADLINE_EXCEEDED"),
    "upstream_unreachable": (502, "UNAVAILABLE"),
    "no_upstream": (501, "UNIMPLEMENTED"),
    "recording_failed": (503, "UNAVAILABLE"),
    "server_error": (500, "INTERNAL"),
    "upstream_error": (502, "UNAVAILABLE"),
    "invalid_request_error": (400, "INVALID_ARGUMENT"),
}
_BY_HTTP = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
            404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED"}


def google_status(http: int) -> str:
    """Google's status name for an HTTP status."""
    return _BY_HTTP.get(http, "INTERNAL" if http >= 500 else "INVALID_ARGUMENT")


def gemini_error(message: str, code: int = 400, status: str | None = None) -> bytes:
    """Google's error body."""
    return dumps({"error": {"code": code, "message": message,
                            "status": status or google_status(code)}}).encode()


def _parts(content: Any) -> list[dict[str, Any]]:
    return dicts(content.get("parts")) if isinstance(content, dict) else []


def _text_of(content: Any) -> str:
    return "\n".join(p["text"] for p in _parts(content)
                     if isinstance(p.get("text"), str) and not p.get("thought"))


def _snake(name: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in name)


def field(obj: dict[str, Any], name: str) -> Any:
    """``obj[name]`` in camelCase or snake_case (Google's JSON takes both)."""
    value = obj.get(name)
    return obj.get(_snake(name)) if value is None else value


def _has(content: dict[str, Any], key: str) -> bool:
    return any(field(p, key) is not None for p in _parts(content))


def function_declarations(body: dict[str, Any]) -> list[ToolSpec]:
    """Each function declared in ``tools``."""
    out = []
    for tool in dicts(body.get("tools")):
        for decl in dicts(field(tool, "functionDeclarations")):
            if isinstance(decl.get("name"), str):
                # Google's JSON takes camelCase and snake_case field names alike.
                schema = next((v for k in ("parametersJsonSchema", "parameters_json_schema",
                                           "parameters") if isinstance(v := decl.get(k), dict)),
                              {})
                out.append(tool_spec(decl["name"], decl.get("description"), schema))
    return out


def _schema(config: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema ``generationConfig`` asks for ({} = any JSON), None for text."""
    if field(config, "responseMimeType") != "application/json":
        return None
    spec = field(config, "responseJsonSchema")
    spec = field(config, "responseSchema") if spec is None else spec
    return spec if isinstance(spec, dict) else {}


class GeminiAdapter(ProtocolAdapter):
    name = "gemini"
    path = "/v1beta/models/{model}:generateContent"
    routes: ClassVar[tuple[str, ...]] = (
        "/v1beta/models/{model}:generateContent",
        "/v1beta/models/{model}:streamGenerateContent",
        "/v1/models/{model}:generateContent",
        "/v1/models/{model}:streamGenerateContent",
    )
    family = GEMINI
    error_prefixes = ("/v1beta/",)

    def __init__(self) -> None:
        self.finished = False  # a chunk with finishReason was seen

    # -- request ---------------------------------------------------------------------------
    def validate(self, body: dict[str, Any]) -> None:
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise BadRequest("* GenerateContentRequest.contents: contents is not specified",
                             param="contents")
        if not all(isinstance(c, dict) and isinstance(c.get("parts"), list) for c in contents):
            raise BadRequest("Invalid JSON payload: each content needs 'parts' (a list)",
                             param="contents")

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        contents = dicts(body.get("contents"))
        system = _text_of(field(body, "systemInstruction"))
        first_user = next((_text_of(c) for c in contents if c.get("role", "user") == "user"), "")

        def person(c: dict[str, Any]) -> bool:
            return c.get("role", "user") == "user" and not _has(c, "functionResponse")

        last = contents[-1] if contents else None
        ends: Ends
        if last is None:
            ends, how = "empty", "no_contents"
        elif _has(last, "functionResponse"):
            ends, how = "tool_output", "function_response"
        elif last.get("role") == "model":
            ends, how = "assistant", "model_last"
        else:
            ends, how = "user_text", "user_content"
        at = max((i for i, c in enumerate(contents) if person(c)), default=-1)
        config = field(body, "generationConfig")
        config = config if isinstance(config, dict) else {}
        limit = field(config, "maxOutputTokens")
        tools = function_declarations(body)
        return RequestInfo(
            stream=self.url_params.get("method") == "streamGenerateContent",
            model=self.url_params.get("model"),
            prompt_text=next((_text_of(c) for c in reversed(contents) if person(c)), ""),
            ends=ends, ends_how=f"gemini:{how}",
            conversation_key=conversation_key(system, first_user),
            offers_tools=bool(tools) or bool(dicts(body.get("tools"))),
            tools=tuple(tools),
            tool_calls_since_person=sum(
                1 for c in contents[at + 1:] for p in _parts(c)
                if field(p, "functionCall") is not None),
            has_person=at >= 0,
            max_tokens=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
            structured=field(config, "responseMimeType") == "application/json"
            and not tools,
            system_text=system,
            stop=stops_or_none(field(config, "stopSequences")),
            schema=_schema(config),
            parts=(field(body, "systemInstruction"), body.get("contents")),
            tool_defs=body.get("tools"),
        )

    def model_answers(self, body: dict[str, Any]) -> list[str]:
        return [_text_of(c) for c in dicts(body.get("contents")) if c.get("role") == "model"]

    def upstream_path(self, path: str, query: str) -> str:
        """The client's path with its ``key`` dropped from the query (the credential goes as
        a header) and ``alt=sse`` on streams (the JSON array is rebuilt for the client)."""
        params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                  if k not in ("key", "alt")]
        if self.url_params.get("method") == "streamGenerateContent":
            params.append(("alt", "sse"))
        return path + ("?" + urlencode(params) if params else "")

    def with_model(self, path: str, body: bytes, model: str) -> tuple[str, bytes]:
        old = self.url_params.get("model", "")
        head, sep, tail = path.partition(f"/models/{old}:")
        return (head + f"/models/{quote(model, safe='')}:" + tail if sep else path), body

    @property
    def json_array(self) -> bool:
        """Whether the client asked for the JSON-array stream (no ``alt=sse``)."""
        return (self.url_params.get("method") == "streamGenerateContent"
                and self.url_params.get("alt") != "sse")

    def complete_at_eof(self) -> bool:
        return self.finished

    # -- streaming -------------------------------------------------------------------------
    def classify(self, ev: SSEEvent) -> Classified:
        obj = json_of(ev)
        if not isinstance(obj, dict):
            return Classified(Kind.OTHER, obj=obj)
        rid = obj.get("responseId") if isinstance(obj.get("responseId"), str) else None
        usage = obj.get("usageMetadata") if isinstance(obj.get("usageMetadata"), dict) else None
        if isinstance(obj.get("error"), dict):
            msg = obj["error"].get("message")
            return Classified(Kind.ERROR, obj=obj, error=str(msg or "error"), response_id=rid)
        candidates = dicts(obj.get("candidates"))
        if any(c.get("finishReason") for c in candidates):
            self.finished = True
        parts = [p for c in candidates for p in _parts(c.get("content"))]
        calls = [p["functionCall"] for p in parts if isinstance(p.get("functionCall"), dict)]
        texts = [p for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
        text = "".join(p["text"] for p in texts)
        if text:
            key = "text" if len(candidates) == 1 and len(texts) == 1 and not calls else None
            return Classified(Kind.CONTENT, text, key, len(calls), usage, rid, obj)
        if calls:
            args = "".join(json.dumps(c.get("args") or {}, ensure_ascii=False) for c in calls)
            return Classified(Kind.TOOL, args, None, len(calls), usage, rid, obj)
        if self.finished and not parts:
            return Classified(Kind.TERMINAL, usage=usage, response_id=rid, obj=obj)
        return Classified(Kind.OTHER, usage=usage, response_id=rid, obj=obj)

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        obj = exact_obj(ev, c)
        part = next(p for p in obj["candidates"][0]["content"]["parts"]
                    if isinstance(p.get("text"), str))
        old, part["text"] = part["text"], piece
        out = b"data: " + dumps(obj).encode() + b"\r\n\r\n"
        part["text"] = old
        return out

    def keepalive(self) -> bytes:
        # The genai SDK's stream reader matches ``^\s*data: …`` and would stall on an SSE
        # comment: blank lines are what it skips.
        return b"\n"

    def error_event(self, message: str, type_: str = "server_error", code: str | None = None,
                    ) -> bytes:
        return b"data: " + self.error_body(message, type_, code) + b"\r\n\r\n"

    # -- non-streaming ---------------------------------------------------------------------
    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        texts, args, tools = [], [], 0
        for cand in dicts(body.get("candidates")):
            for part in _parts(cand.get("content")):
                if isinstance(part.get("text"), str) and not part.get("thought"):
                    texts.append(part["text"])
                elif isinstance(part.get("functionCall"), dict):
                    tools += 1
                    args.append(json.dumps(part["functionCall"].get("args") or {},
                                           ensure_ascii=False))
        usage = body.get("usageMetadata") if isinstance(body.get("usageMetadata"), dict) else None
        rid = body.get("responseId") if isinstance(body.get("responseId"), str) else None
        return BodyInfo("".join(texts), tools, usage, rid, "".join(args))

    # -- errors ----------------------------------------------------------------------------
    def error_body(self, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None) -> bytes:
        http, status = _STATUS.get(code or "", _STATUS.get(type_, (400, "INVALID_ARGUMENT")))
        return gemini_error(message, http, status)
