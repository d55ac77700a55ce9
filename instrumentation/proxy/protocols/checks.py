"""Strict request checks: what each protocol's server refuses, and the message it gives.

The view (:class:`~.base.RequestInfo`) is tolerant because the proxy classifies a request
before its upstream has judged it; a server of the protocol (the simulated model) must
refuse a bad request instead. Each adapter's ``validate`` uses these helpers and raises
:class:`BadRequest`, which the server renders in the protocol's own error shape.
"""

from __future__ import annotations

import json
from typing import Any

from ..refusal import Refusal

__all__ = ["BadRequest", "decode_json", "flag", "positive_int", "require_list",
           "require_model", "stop_list"]


class BadRequest(Refusal):
    """A request body the protocol refuses (400 unless said): a :class:`Refusal` with the
    message first, as the protocols' checks raise it."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(status, message, code, param)


def decode_json(body: bytes) -> dict[str, Any]:
    """A JSON object body, or a 400 :class:`BadRequest`."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}",
                         code="invalid_json") from exc
    except RecursionError:
        raise BadRequest("The JSON body of your request is nested too deeply.",
                         code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.", code="invalid_json")
    return data


def require_model(data: dict[str, Any]) -> str:
    """OpenAI's check of ``model``."""
    model = data.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter", param="model",
                         code="missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model", code="invalid_type")
    return model


def require_list(data: dict[str, Any], name: str) -> list[Any]:
    """A required non-empty array field (OpenAI's messages)."""
    value = data.get(name)
    if value is None:
        raise BadRequest(f"Missing required parameter: '{name}'.", param=name,
                         code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{name}' must be a non-empty array.", param=name, code="invalid_type")
    return value


def positive_int(data: dict[str, Any], *names: str) -> None:
    """Each of ``names`` present is an integer >= 1."""
    for name in names:
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise BadRequest(f"Invalid '{name}': expected an integer >= 1, got {value!r}.",
                             param=name, code="invalid_value")


def flag(data: dict[str, Any], name: str) -> None:
    """``name``, if present and not null, is a boolean."""
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean.", param=name, code="invalid_type")


def stop_list(value: Any, name: str) -> tuple[str, ...]:
    """Stop sequences: a string or an array of strings (empty ones dropped)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRequest(f"'{name}' must be a string or an array of strings.", param=name)
    return tuple(s for s in value if s)


def stops_or_none(value: Any) -> tuple[str, ...]:
    """Stop sequences read tolerantly (a wrong shape reads as none), for the view."""
    try:
        return stop_list(value, "stop")
    except BadRequest:
        return ()
