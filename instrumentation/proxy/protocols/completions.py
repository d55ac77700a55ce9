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
    RequestInfo,
    SSEEvent,
    dumps,
    exact_obj,
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

    def read_request(self, body: dict[str, Any]) -> RequestInfo:
        text = _prompt_text(body.get("prompt"))
        suffix = body.get("suffix")
        if isinstance(suffix, str) and suffix:
            text = f"{text}\n{suffix}"
        return request_info(body, text, ends_how="completions:prompt")

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
