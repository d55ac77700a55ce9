"""OpenAI legacy Completions: ``POST /v1/completions`` (inline and fill-in-the-middle).

Same stream framing as Chat (``data:`` chunks, ``[DONE]``); the text is ``choices[].text``.
The prompt fingerprinted is the prompt plus the ``suffix`` (the code around the cursor), so a
later completion request can show that an earlier answer persisted between them.
"""

from __future__ import annotations

from typing import Any

from .base import (
    BodyInfo,
    Classified,
    Kind,
    OpenAIChunkAdapter,
    SSEEvent,
    dumps,
    exact_obj,
)
from .checks import BadRequest, flag, positive_int, require_model, stop_list, stops_or_none
from .view import (
    RequestInfo,
    request_info,
)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt[-1]
    return ""  # token-id prompts carry no text to fingerprint


class CompletionsAdapter(OpenAIChunkAdapter):
    name = "completions"
    path = "/v1/completions"

    def validate(self, body: dict[str, Any]) -> None:
        require_model(body)
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("Missing required parameter: 'prompt'.", param="prompt",
                             code="missing_required_parameter")
        if not isinstance(prompt, str) and not (
                isinstance(prompt, list) and all(isinstance(p, str) for p in prompt)):
            raise BadRequest("'prompt' must be a string or an array of strings.",
                             param="prompt", code="invalid_type")
        if body.get("suffix") is not None and not isinstance(body["suffix"], str):
            raise BadRequest("'suffix' must be a string.", param="suffix", code="invalid_type")
        flag(body, "stream")
        positive_int(body, "max_tokens")
        stop_list(body.get("stop"), "stop")

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        text = _prompt_text(body.get("prompt"))
        suffix = body.get("suffix")
        if isinstance(suffix, str) and suffix:
            text = f"{text}\n{suffix}"
        return request_info(body, text, ends_how="completions:prompt",
                            stop=stops_or_none(body.get("stop")),
                            parts=(body.get("prompt"), body.get("suffix")))

    def model_answers(self, body: dict[str, Any]) -> list[str]:
        return []  # a prompt, no conversation

    def classify_choices(
        self, choices: list[Any], usage: dict[str, Any] | None, rid: str | None,
        obj: dict[str, Any],
    ) -> Classified:
        texts = [
            ch["text"] for ch in choices if isinstance(ch, dict) and isinstance(ch.get("text"), str)
        ]
        text = "".join(texts)
        if not text:
            return Classified(Kind.OTHER, usage=usage, response_id=rid, obj=obj)
        key = "text" if len(choices) == 1 else None
        return Classified(Kind.CONTENT, text, key, 0, usage, rid, obj)

    def _reserialize(self, ev: SSEEvent, c: Classified, piece: str) -> bytes:
        obj = exact_obj(ev, c)
        choice = obj["choices"][0]
        old = choice["text"]
        choice["text"] = piece
        out = b"data: " + dumps(obj).encode() + b"\n\n"
        choice["text"] = old
        return out

    def read_body(self, body: dict[str, Any]) -> BodyInfo:
        texts = [
            ch["text"]
            for ch in body.get("choices") or []
            if isinstance(ch, dict) and isinstance(ch.get("text"), str)
        ]
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        rid = body.get("id") if isinstance(body.get("id"), str) else None
        return BodyInfo("".join(texts), 0, usage, rid)
