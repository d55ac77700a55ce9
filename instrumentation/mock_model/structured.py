"""Structured outputs: requests that ask for JSON matching a schema get such JSON back.

Coding agents use them for side calls: Claude Code titles its sessions with
`output_config.format = {"type": "json_schema", ...}`, the Codex TUI its threads with
`text.format` (as does `codex exec --output-schema`). A prose answer there would be
unparseable, so the simulated model answers with a small document that validates against the
schema, its strings drawn from the prompt. (Which schema a request asks for: its protocol
module, `RequestInfo.schema`.)
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["json_answer"]

_MAX_DEPTH = 8
_TAG = re.compile(r"<[^>\n]{1,80}>")
_WORD = re.compile(r"[^\W_][\w'.-]*")
_PHRASE_WORDS = 6


def json_answer(schema: dict[str, Any], prompt: str) -> str:
    """A JSON document valid for `schema` (the common subset of JSON Schema), as text; an
    empty schema (JSON mode without a schema) gets a one-field object."""
    words = _WORD.findall(_TAG.sub(" ", prompt)) or ["simulated", "answer"]
    value = _sample(schema, schema, words, 0) if schema else {"answer": _phrase(words)}
    return json.dumps(value, ensure_ascii=False)


def _phrase(words: list[str]) -> str:
    text = " ".join(words[:_PHRASE_WORDS])
    return text[:1].upper() + text[1:]


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` such as `#/$defs/step` (anything else resolves to {})."""
    if not ref.startswith("#/"):
        return {}
    node: Any = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def _sample(schema: Any, root: dict[str, Any], words: list[str], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if isinstance(schema.get("$ref"), str):
        return _sample(_resolve(schema["$ref"], root), root, words, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            # Prefer a non-null branch: a nullable field reads better with a value.
            chosen = next((o for o in options if isinstance(o, dict)
                           and o.get("type") != "null"), options[0])
            return _sample(chosen, root, words, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: _sample(sub, root, words, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [_sample(schema.get("items", {}), root, words, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = max(0, low) if isinstance(low, int | float) else 0
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            value = schema["exclusiveMinimum"] + 1
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = _phrase(words)
    limit = schema.get("maxLength")
    return text[:limit] if isinstance(limit, int) and limit > 0 else text
