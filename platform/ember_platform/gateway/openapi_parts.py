"""The pieces of the OpenAPI document that ``openapi`` (the route table's operations) and the deployed functions'
paths share: references, parameters, bodies, answers and error codes; and those paths themselves."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ember.wire import (
    HTTP_BATCH_SIZE_HEADER,
    HTTP_CALL_ID_HEADER,
    HTTP_TIMEOUT_HEADER,
    HTTP_VERSION_HEADER,
    MIN_TIMEOUT_S,
    Deployment,
    FunctionSpec,
)

REF = "#/components/schemas/{name}"
JSON = "application/json"
_DEFS_REF = "#/$defs/"
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9._-]")
# Keywords that would make a function's schema resolve references against something other than this document.
_DROPPED = frozenset({"$id", "$schema", "$anchor", "$dynamicAnchor", "$dynamicRef", "$vocabulary"})

_ERRORS = {
    400: "bad_request: malformed JSON, header, call id or query value (`field` names it)",
    401: "unauthenticated: no token, or a malformed, unknown, revoked or expired one (WWW-Authenticate: Bearer)",
    403: "forbidden: the token lacks the scope this needs",
    404: "not_found: unknown app, function, service or call id (the message lists what exists)",
    405: "method_not_allowed: a route of the API, not a call",
    409: "conflict: the call already runs or has finished, or an Idempotency-Key reused with another body",
    413: "payload_too_large: the body is over the limit",
    415: "bad_request: a body of a media type the function cannot take (a raw body for a function not of bytes)",
    422: "invalid_input: the body does not fit its type (`field` is its JSON path)",
    429: "overloaded: the replica's queue is full or the deadline would be missed; rate_limited: a quota's rate "
         "or concurrent calls are used up (Retry-After)",
    500: "user_error: the function raised (`type` is the exception's class)",
    503: "unavailable: no replica became ready in time (Retry-After)",
    504: "deadline_exceeded: the call did not finish within its deadline",
}
_CALL_ERRORS = (400, 404, 405, 413, 415, 422, 429, 500, 503, 504)
_SPAWN_ERRORS = (400, 404, 405, 409, 413, 422, 429, 503)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(name=name)}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _header(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": schema}


_TIMEOUT = _header(HTTP_TIMEOUT_HEADER, "the call's deadline in seconds (capped by the function's timeout_s)",
                   {"type": "number", "minimum": MIN_TIMEOUT_S})
_IDEMPOTENCY_KEY = _header("Idempotency-Key", "a repeat with the same key and body answers the first call",
                           {"type": "string", "minLength": 1, "maxLength": 256})
def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _answer(description: str, schema: dict[str, Any] | None, media: str = JSON,
            headers: Mapping[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = {media: {"schema": schema}}
    if headers:
        answer["headers"] = dict(headers)
    return answer


_CALL_HEADERS = {
    HTTP_CALL_ID_HEADER: {"description": "the call's id", "schema": {"type": "string"}},
    HTTP_BATCH_SIZE_HEADER: {"description": "the size of the batch the call ran in", "schema": {"type": "integer"}},
    HTTP_VERSION_HEADER: {"description": "the app version that ran the call", "schema": {"type": "integer"}},
}


# -- the deployed functions ---------------------------------------------------------------------------------------


def function_paths(deployments: Mapping[str, Deployment]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One path per deployed function and one for its spawn, and the component schemas their bodies refer to."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for app in sorted(deployments):
        for service in deployments[app].manifest.services:
            for fn in service.functions:
                try:
                    body, output = _function_schemas(app, fn, schemas)
                except Exception:  # a schema no document can hold (too deep...): any JSON, rather than no document
                    body, output = _json_body({}, required=fn.input_mode != "none"), {}
                output = {"type": "array", "items": output} if fn.stream else output  # a generator's, as JSON
                _function_operations(paths, app, fn, body, output)
    return paths, schemas


def _function_schemas(app: str, fn: FunctionSpec, schemas: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    found: dict[str, Any] = {}
    if fn.input_mode == "none":
        body = _json_body({"anyOf": [{"type": "object", "maxProperties": 0}, {"type": "null"}]}, required=False)
    else:
        body = _json_body(_hoisted(fn.input_schema, f"{app}.{fn.name}.input.", found))
    output = _hoisted(fn.output_schema, f"{app}.{fn.name}.output.", found)
    schemas.update(found)
    return body, output


def _function_operations(paths: dict[str, Any], app: str, fn: FunctionSpec, body: dict[str, Any],
                         output: dict[str, Any]) -> None:
    path = f"/v1/{app}/{fn.name}"
    params = [_TIMEOUT]
    call_errors = _CALL_ERRORS if fn.public else sorted({*_CALL_ERRORS, 401, 403})
    paths[path] = {"post": {
        "operationId": f"call {app}.{fn.name}", "summary": f"Call {app}.{fn.name}", "parameters": params,
        "requestBody": body,
        "responses": {"200": _answer(f"{fn.name}'s result", output, headers=_CALL_HEADERS),
                      **{str(code): _answer(_ERRORS[code], _ref("ErrorBody")) for code in call_errors}},
        **({"security": []} if fn.public else {})}}
    paths[path + "/spawn"] = {"post": {
        "operationId": f"spawn {app}.{fn.name}", "summary": f"Queue a call of {app}.{fn.name}",
        "parameters": [*params, _IDEMPOTENCY_KEY], "requestBody": body,
        "responses": {"202": _answer("queued", _ref("SpawnReply")),
                      **{str(code): _answer(_ERRORS[code], _ref("ErrorBody"))
                         for code in sorted({*_SPAWN_ERRORS, 401, 403})}}}}


def _hoisted(schema: Any, prefix: str, found: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (a JSON Schema as msgspec writes it, with its ``$defs``) with its definitions moved into ``found``
    under ``prefix`` + their names, and its references pointed there. A reference that names nothing, or points
    outside the schema, is dropped (that node takes any value)."""
    if not isinstance(schema, dict):
        return {} if schema is not False else {"not": {}}
    defs = schema.get("$defs")
    names = {name: _NOT_A_NAME.sub("_", prefix + name) for name in defs} if isinstance(defs, dict) else {}
    top = _rewritten({k: v for k, v in schema.items() if k != "$defs"}, names)
    for name, target in names.items():
        found[target] = _rewritten(defs[name], names) if isinstance(defs, dict) else {}
    return top if isinstance(top, dict) else {}


def _rewritten(node: Any, names: Mapping[str, str]) -> Any:
    if isinstance(node, list):
        return [_rewritten(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "$ref":
            target = names.get(value[len(_DEFS_REF):]) if isinstance(value, str) and value.startswith(_DEFS_REF) \
                else None
            if target is not None:
                out[key] = REF.format(name=target)
            continue
        out[key] = _rewritten(value, names)
    return out
