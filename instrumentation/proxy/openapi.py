"""The OpenAPI 3.1 description of the proxy's own endpoints (``/flowtrial/v1/...``).

Served at ``GET /flowtrial/v1/openapi.json`` (open, like health: it holds no data). It covers
the event API (request body from the pydantic models it validates with,
:mod:`flowtrial.instrumentation.proxy.events_api`), Continue's data destination, health, and the
admin endpoints (:mod:`flowtrial.instrumentation.proxy.admin`). The model-protocol routes
(``/v1/...``) are the OpenAI and Anthropic APIs' own and are described by them, not here.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .events_api import _MAX_TS, _MIN_TS, EventBatch

__all__ = ["OPENAPI_PATH", "openapi_document", "openapi_routes", "openapi_schema"]

OPENAPI_PATH = "/flowtrial/v1/openapi.json"
_REF = "#/components/schemas/{model}"
_PARTICIPANT: list[dict[str, list[str]]] = [{"participantKey": []}, {"participantApiKey": []}]


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _ok(schema_name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema_name}"}}}}


def _counts(depth: int) -> dict[str, Any]:
    """{name: count} (depth 1) or {name: {name: count}} (depth 2)."""
    leaf: dict[str, Any] = {"type": "integer", "minimum": 0}
    for _ in range(depth):
        leaf = {"type": "object", "additionalProperties": leaf}
    return leaf


def _components() -> dict[str, Any]:
    batch = EventBatch.model_json_schema(ref_template=_REF)
    defs = batch.pop("$defs", {})
    event = defs["ClientEvent"]
    # Document what the validator adds to the field types: the accepted range of epoch ts.
    for option in event["properties"]["ts"]["anyOf"]:
        if option.get("type") == "number":
            option.update(minimum=_MIN_TS, maximum=_MAX_TS)
    nullable_str = {"type": ["string", "null"]}
    iso = {"type": ["string", "null"], "format": "date-time"}
    return {
        "securitySchemes": {
            "participantKey": {"type": "http", "scheme": "bearer",
                               "description": "The participant's own key (ft_…)."},
            "participantApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                                  "description": "The participant's key, Anthropic style."},
            "adminToken": {"type": "http", "scheme": "bearer",
                           "description": "The value of the variable named by "
                                          "proxy.admin_token_env."},
        },
        "schemas": {
            **defs,
            "EventBatch": batch,
            "Error": {
                "type": "object", "required": ["error"],
                "properties": {"error": {
                    "type": "object", "required": ["message", "type"],
                    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                   "param": nullable_str, "code": nullable_str},
                }},
            },
            "Accepted": {"type": "object", "required": ["accepted"],
                         "properties": {"accepted": {"type": "integer", "minimum": 0}}},
            "ContinueData": {
                "type": "object", "required": ["name"],
                "description": "Continue's development-data body (name, data, schema, level, "
                               "profileId). Only ``name`` is required; a body whose name or "
                               "data is not a decision is answered 200 and ignored.",
                "properties": {"name": {"type": "string"}},
            },
            "ContinueAccepted": {
                "type": "object", "required": ["accepted"],
                "properties": {"accepted": {"type": "integer", "minimum": 0, "maximum": 1},
                               "duplicates": {"type": "integer", "minimum": 0, "maximum": 1},
                               "ignored": {"type": "string"}, "kind": {"type": "string"},
                               "cycle_id": nullable_str, "link": {"type": "string"}},
            },
            "Health": {
                "type": "object", "required": ["status"],
                "properties": {"status": {"type": "string"},
                               "requests": {"type": "integer"},
                               "open_streams": {"type": "integer"},
                               "cycles_recorded": {"type": "integer"},
                               "errors": {"type": "integer"},
                               "writer_queue": {"type": "integer"},
                               "uptime_s": {"type": "number"},
                               "quiet_gc": {
                                   "type": ["object", "null"],
                                   "description": "Older-generation garbage collections run "
                                                  "between first-token releases (null: "
                                                  "proxy.quiet_gc is off); forced = run "
                                                  "with a release due, having waited too long.",
                                   "properties": {
                                       "collections_gen1": {"type": "integer"},
                                       "collections_gen2": {"type": "integer"},
                                       "forced": {"type": "integer"},
                                       "slowest_ms_gen1": {"type": "number"},
                                       "slowest_ms_gen2": {"type": "number"}}}},
            },
            "AdminStatus": {
                "type": "object",
                "required": ["study", "participants_enrolled", "participants_seen", "cycles",
                             "cycles_total", "violations", "events", "tasks", "srm", "proxy"],
                "properties": {
                    "study": {"type": "object"},
                    "participants_enrolled": {"type": "integer", "minimum": 0},
                    "participants_seen": {"type": "integer", "minimum": 0},
                    "assignments": _counts(1),
                    "cycles": _counts(2),
                    "cycles_total": {"type": "integer", "minimum": 0},
                    "violations": _counts(1),
                    "events": {"type": "integer", "minimum": 0},
                    "tasks": {"type": "integer", "minimum": 0},
                    "srm": {"type": ["object", "null"]},
                    "proxy": {"type": ["object", "null"]},
                    "database": {"type": ["object", "null"]},
                },
            },
            "AdminParticipants": {
                "type": "object", "required": ["participants"],
                "properties": {"participants": {"type": "array", "items": {
                    "type": "object",
                    "required": ["id", "arm", "arms", "cycles", "last_seen_at"],
                    # Closed on purpose: no key, key id or hash may ever appear here.
                    "additionalProperties": False,
                    "properties": {
                        "id": {"type": "string"}, "arm": nullable_str,
                        "arms": {"type": "array", "items": {"type": "string"}},
                        "simulated": {"type": "boolean"},
                        "cycles": {"type": "integer", "minimum": 0},
                        "last_cycle_at": iso, "last_seen_at": iso,
                    },
                }}},
            },
        },
    }


def events_paths() -> dict[str, Any]:
    """The event API's part of the document."""
    return {"/flowtrial/v1/events": {"post": {
        "operationId": "postEvents",
        "summary": "Record decisions and context events of the authenticated participant "
                   "(all or nothing).",
        "security": _PARTICIPANT,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/EventBatch"}}}},
        "responses": {
            "200": _ok("Accepted", "Every event is durable."),
            "400": _error_response("Not JSON."),
            "401": _error_response("Missing or unknown participant key."),
            "413": _error_response("Body over proxy.max_body_bytes."),
            "422": _error_response("An invalid event, or a cycle that is not the "
                                   "participant's: nothing written."),
            "503": _error_response("The database could not record them."),
        },
    }}}


def continue_paths() -> dict[str, Any]:
    """Continue's data destination's part of the document."""
    return {"/flowtrial/v1/continue": {"post": {
        "operationId": "postContinueData",
        "summary": "Continue's development-data destination (decisions become events).",
        "security": [{"participantKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ContinueData"}}}},
        "responses": {
            "200": _ok("ContinueAccepted", "Recorded (accepted 1), a re-send of one already "
                                           "recorded (duplicates 1) or ignored."),
            "400": _error_response("Not JSON."),
            "401": _error_response("Missing or unknown participant key."),
            "413": _error_response("Body over proxy.max_body_bytes."),
            "422": _error_response("Not a Continue data body."),
            "503": _error_response("The database could not record it."),
        },
    }}}


def health_paths() -> dict[str, Any]:
    """The health endpoint's part of the document (the proxy's own, always served)."""
    return {"/flowtrial/v1/health": {"get": {
        "operationId": "getHealth", "summary": "Liveness and load (no participant data).",
        "security": [],
        "responses": {"200": _ok("Health", "Serving."),
                      "503": _ok("Health", "Not serving: recording is unavailable.")},
    }}}


def document_paths() -> dict[str, Any]:
    """This document's own entry."""
    return {OPENAPI_PATH: {"get": {
        "operationId": "getOpenApi", "summary": "This document.", "security": [],
        "responses": {"200": {"description": "OpenAPI 3.1", "content": {
            "application/json": {"schema": {"type": "object"}}}}},
    }}}


def admin_paths() -> dict[str, Any]:
    """The admin endpoints' part of the document."""
    admin: list[dict[str, list[str]]] = [{"adminToken": []}]
    admin_errors = {"401": _error_response("No admin token."),
                    "403": _error_response("Admin endpoints disabled, or not the admin token.")}
    return {
        "/flowtrial/v1/admin/status": {"get": {
            "operationId": "getAdminStatus",
            "summary": "Cycles per arm and status, violations, participants seen, writer.",
            "security": admin,
            "responses": {"200": _ok("AdminStatus", "Study and proxy status."),
                          **admin_errors},
        }},
        "/flowtrial/v1/admin/participants": {"get": {
            "operationId": "getAdminParticipants",
            "summary": "Participants: id, arm(s), cycles, last seen (never key material).",
            "security": admin,
            "responses": {"200": _ok("AdminParticipants", "Every enrolled participant."),
                          **admin_errors},
        }},
    }


def openapi_document(paths: dict[str, Any]) -> dict[str, Any]:
    """The document describing ``paths`` (the served extensions' fragments)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "flowtrial proxy API", "version": "1",
                 "description": "The flowtrial proxy's own endpoints (events, health, admin)."},
        "paths": paths,
        "components": _components(),
    }


@cache
def _schema() -> dict[str, Any]:
    return openapi_document({**events_paths(), **continue_paths(), **health_paths(),
                             **document_paths(), **admin_paths()})


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI document (a fresh copy: callers may change it)."""
    return copy.deepcopy(_schema())


def openapi_routes(paths: dict[str, Any] | None = None) -> list[BaseRoute]:
    """``GET /flowtrial/v1/openapi.json``, describing ``paths`` (default: every endpoint)."""
    raw = json.dumps(_schema() if paths is None else openapi_document(paths)).encode()

    async def endpoint(request: Request) -> Response:
        return Response(raw, media_type="application/json")

    return [Route(OPENAPI_PATH, endpoint, methods=["GET"], name="flowtrial_openapi")]
