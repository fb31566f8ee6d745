"""``GET /openapi.json``: the HTTP API as an OpenAPI 3.1 document.

Every route of the route table is an operation (``HEAD``, which starlette adds to every ``GET``, is left implicit),
with its path, query and header parameters, its request body, its answer and the error codes it documents; every
error has the one shape ``{"error": {...}}`` (``ErrorBody``). The schemas of request and answer bodies are
generated from the wire Structs by msgspec, under ``#/components/schemas``.

``POST /v1/<app>/<fn>`` and ``.../spawn`` take whatever the function takes, so next to their templated paths the
document has one concrete path per deployed function (``/v1/hello/greet``, ``/v1/hello/greet/spawn``) whose body is
the function's ``input_schema`` (and answer its ``output_schema``), from the current deployments. The rest of the
document is built once; the functions' part is rebuilt when the deployments change, and the encoded document is
kept until they do. A function whose schemas cannot be shown is documented as taking and answering any JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

import ember
from ember.wire import (
    AppView,
    CallRecord,
    DeadLetter,
    Deployment,
    DeployRequest,
    ErrorBody,
    LogLine,
    Quota,
    QuotaRequest,
    QuotaView,
    ReplayReply,
    ReplayRequest,
    RolloutRequest,
    ScaleRequest,
    ServiceStatus,
    SpawnReply,
    StatusView,
    TokenInfo,
    TokenRequest,
    encoder,
)
from ember.wire.builds import BuildStart
from ember.wire.grants import SubjectGrant, SubjectGrantRequest
from ember.wire.images import BuildView
from ember.wire.quotas import QUOTA_NAME
from ember.wire.schedules import ScheduleRun, ScheduleView
from ember.wire.secrets import SECRET_NAME, SecretRequest, SecretView
from ember.wire.stats import StatsView
from ember.wire.tokens import TOKEN_ID, NewToken
from ember.wire.validate import APP_NAME
from ember.wire.volumes import VOLUME_NAME, ChunksMissing, ChunksQuery, VolumeCommit, VolumeView
from ember_platform.calls.durable import CALL_ID, MAX_CALL_ID
from ember_platform.gateway import events, openapi_oip, openapi_openai
from ember_platform.gateway.apps import MAX_LOG_LINES
from ember_platform.gateway.calls import FUNCTION_NAME
from ember_platform.gateway.guard import NEED, OPEN, principal_of
from ember_platform.gateway.openapi_parts import (
    _CALL_ERRORS,
    _CALL_HEADERS,
    _ERRORS,
    _IDEMPOTENCY_KEY,
    _SPAWN_ERRORS,
    _TIMEOUT,
    JSON,
    REF,
    _answer,
    _json_body,
    _query,
    _ref,
    function_paths,
)
from ember_platform.gateway.responses import platform_of

OPENAPI_VERSION = "3.1.0"
_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # starlette's {path:rest}: OpenAPI's {path}
_BARE = r"{\1}"

# The answers' and requests' bodies, by the Struct (or container of one) they are encoded from.
_BODIES: dict[str, Any] = {
    "ErrorBody": ErrorBody, "AppList": list[AppView], "AppView": AppView, "Deployment": Deployment,
    "DeployRequest": DeployRequest, "LogLines": list[LogLine], "DeadLetters": list[DeadLetter],
    "ReplayRequest": ReplayRequest, "ReplayReply": ReplayReply, "ScaleRequest": ScaleRequest,
    "ServiceStatus": ServiceStatus, "StatusView": StatusView,
    "StatsView": StatsView, "CallRecord": CallRecord, "SpawnReply": SpawnReply,
    "TokenRequest": TokenRequest, "NewToken": NewToken, "TokenInfo": TokenInfo, "TokenList": list[TokenInfo],
    "QuotaRequest": QuotaRequest, "Quota": Quota, "QuotaList": list[QuotaView],
    "SecretRequest": SecretRequest, "SecretView": SecretView, "SecretList": list[SecretView],
    "SubjectGrantRequest": SubjectGrantRequest, "SubjectGrant": SubjectGrant, "SubjectGrantList": list[SubjectGrant],
    "SubjectGrantLeft": SubjectGrant | None,
    "RolloutRequest": RolloutRequest, "BuildStart": BuildStart, "BuildView": BuildView,
    "VolumeView": VolumeView, "VolumeList": list[VolumeView], "VolumeCommit": VolumeCommit,
    "ChunksQuery": ChunksQuery, "ChunksMissing": ChunksMissing,
    "ScheduleList": list[ScheduleView], "ScheduleView": ScheduleView, "ScheduleRun": ScheduleRun,
    **openapi_oip.BODIES,
    **openapi_openai.BODIES,
}
# Answers that are plain dicts in their handlers, not Structs.
_PLAIN: dict[str, dict[str, Any]] = {
    "Health": {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]},
    "Readiness": {"type": "object", "required": ["status"],
                  "properties": {"status": {"type": "string", "enum": ["ready", "not ready"]},
                                 "nats_connected": {"type": "boolean"}}},
    "BundleReply": {"type": "object", "required": ["sha256", "size", "created"],
                    "properties": {"sha256": {"type": "string"}, "size": {"type": "integer"},
                                   "created": {"type": "boolean"}}},
}

_BEARER = {"type": "http", "scheme": "bearer", "bearerFormat": "ember_<id>_<secret>",
           "description": "an Ember token (`ember token create`, `ember login`, EMBER_TOKEN)"}
_NEEDS = {"admin": " with the admin scope", "deploy": " with the deploy scope", "invoke": " with the invoke scope",
          "read": " with the read scope (deploy implies it)", "token": "",
          "events": " with the events scope"}


def _string(pattern: re.Pattern[str] | None = None, max_length: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if pattern is not None:
        schema["pattern"] = f"^(?:{pattern.pattern})$"
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


_PATH_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "app": ("an app's name", _string(APP_NAME, 63)),
    "name": ("a function: its name, or Class.method for a class model's method", _string(FUNCTION_NAME, 257)),
    "call_id": ("a queued call's id", _string(CALL_ID, MAX_CALL_ID)),
    "sha256": ("the bundle's lowercase hex sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"}),
    "token_id": ("a token's id (the public part of ember_<id>_<secret>)", _string(TOKEN_ID, 32)),
    "quota": ("a quota's name", _string(QUOTA_NAME, 63)),
    "secret": ("a secret's name", _string(SECRET_NAME, 63)),
    "build_id": ("a build's id", {"type": "string", "pattern": "^[0-9a-f]{32}$"}),
    "volume": ("a volume's name", _string(VOLUME_NAME, 63)),
    **openapi_oip.PATH_PARAMS,
    **openapi_openai.PATH_PARAMS,
    **events.PATH_PARAMS,
}


_FUNCTION_QUERY = _query("function", "only this function's", _string(FUNCTION_NAME, 257))
_SERVICE_QUERY = _query("service", "only this service's", {"type": "string"})


# (method, path) -> summary, answer (status, description, schema or None, media type), error codes, query and header
# parameters, request body. Every route of the route table has one (a test checks it).
_Op = tuple[str, tuple[int, str, dict[str, Any] | None, str], tuple[int, ...], list[dict[str, Any]],
            dict[str, Any] | None]
_OPERATIONS: dict[tuple[str, str], _Op] = {
    ("GET", "/healthz"): ("The process is up", (200, "up", _ref("Health"), JSON), (), [], None),
    ("GET", "/readyz"): ("NATS is connected and the state loaded",
                         (200, "ready (503 with the same shape when not)", _ref("Readiness"), JSON), (), [], None),
    ("GET", "/metrics"): ("Prometheus metrics", (200, "metrics in Prometheus' text format", {"type": "string"},
                                                 "text/plain"), (), [], None),
    ("GET", "/ui"): ("The web console's page (open; its data needs a token, given as /ui#token=...)",
                     (200, "the page", {"type": "string"}, "text/html"), (400,), [], None),
    ("GET", "/ui/{name}"): ("One of the web console's static files", (200, "the file", {"type": "string"},
                                                                       "text/plain"), (400, 404), [], None),
    ("GET", "/v1/stats"): ("Each function's recent call rate, error share, p50 and p99 at the gateway",
                           (200, "per function, one point per interval", _ref("StatsView"), JSON), (), [], None),
    ("GET", "/openapi.json"): ("This document", (200, "an OpenAPI 3.1 document", {"type": "object"}, JSON), (), [],
                               None),
    ("PUT", "/v1/bundles/{sha256}"): (
        "Upload a bundle (verified against its address)", (201, "stored (200: already, for this token's apps)",
                                                           _ref("BundleReply"), JSON), (400, 403, 413, 422),
        [_query("app", "the app it is for (an admin's upload is then recorded for that app alone)",
                {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"})],
        {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                "format": "binary"}}}}),
    ("GET", "/v1/apps"): ("List the deployed apps", (200, "the apps", _ref("AppList"), JSON), (), [], None),
    ("GET", "/v1/apps/{app}"): ("Show an app, with its replicas", (200, "the app", _ref("AppView"), JSON), (404,),
                                [], None),
    ("DELETE", "/v1/apps/{app}"): ("Delete an app", (204, "deleted", None, JSON), (404,), [], None),
    ("POST", "/v1/apps/{app}/deployments"): (
        "Deploy a new version of an app", (201, "the current version", _ref("Deployment"), JSON),
        (400, 404, 409, 413, 422), [],
        _json_body(_ref("DeployRequest"))),
    ("POST", "/v1/apps/{app}/builds"): (
        "Lock and build an app's images on a node and read its manifest inside its image (see `ember push`)",
        (202, "the build, started", _ref("BuildView"), JSON), (400, 404, 413, 422, 503), [],
        _json_body(_ref("BuildStart"))),
    ("GET", "/v1/apps/{app}/builds/{build_id}"): (
        "A build's state, its log from line `since`, and once ready the manifest with its images locked",
        (200, "the build", _ref("BuildView"), JSON), (400, 404),
        [_query("since", "the first log line wanted", {"type": "integer", "minimum": 0, "maximum": 999_999_999})],
        None),
    ("GET", "/v1/apps/{app}/logs"): (
        "Replica output: the kept lines, or with follow=true those then each new line as it comes "
        "(newline-delimited JSON for Accept: application/x-ndjson, else Server-Sent Events)",
        (200, "log lines, oldest first", _ref("LogLines"), JSON), (400, 404, 429),
        [_SERVICE_QUERY, _query("since", "only lines after this timestamp", {"type": "number", "minimum": 0}),
         _query("until", "only lines up to this timestamp", {"type": "number", "minimum": 0}),
         _query("replica", "only this replica's lines (an id as `ember status` shows it)",
                {"type": "string", "pattern": "^[ -~]*$", "maxLength": 128}),
         _query("stream", "only this stream's lines", {"enum": ["stdout", "stderr", "agent"]}),
         _query("follow", "keep the answer open and push each new line", {"type": "boolean"}),
         _query("limit", f"at most this many lines (the last {MAX_LOG_LINES} are kept: more asks for all)",
                {"type": "integer", "minimum": 1})],
        None),
    ("GET", "/v1/apps/{app}/dead"): (
        "An app's dead letters, oldest first", (200, "a page of dead letters", _ref("DeadLetters"), JSON), (400, 404),
        [_FUNCTION_QUERY, _query("limit", "letters per page", {"type": "integer", "minimum": 1, "maximum": 1000}),
         _query("after", "the seq of the last letter of the previous page",
                {"type": "integer", "minimum": 0, "maximum": 2**63})], None),
    ("POST", "/v1/apps/{app}/dead/replay"): (
        "Resubmit dead letters as new calls", (200, "the new call ids", _ref("ReplayReply"), JSON),
        (400, 404, 413, 422), [], _json_body(_ref("ReplayRequest"))),
    ("POST", "/v1/apps/{app}/scale"): (
        "Set a service's replica bounds at run time (max_replicas at least min_replicas, else 422)",
        (200, "the service's status", _ref("ServiceStatus"), JSON),
        (400, 404, 413, 422), [], _json_body(_ref("ScaleRequest"))),
    ("POST", "/v1/apps/{app}/promote"): (
        "Give the canary all of the app's calls; the version it replaces drains and stops",
        (200, "the app", _ref("AppView"), JSON), (404, 409, 413), [], None),
    ("POST", "/v1/apps/{app}/rollback"): (
        "Serve an older kept version again (the one before unless `version` says which): at once if it still "
        "serves, else once its minimum replicas are ready; the versions it replaces drain and stop",
        (200, "the app", _ref("AppView"), JSON), (400, 404, 409, 413, 422), [],
        {"required": False, "content": {JSON: {"schema": _ref("RolloutRequest")}}}),
    ("GET", "/v1/schedules"): (
        "The scheduled functions of the apps the token sees: each one's schedule, next and last run, paused or not",
        (200, "the schedules", _ref("ScheduleList"), JSON), (400,),
        [_query("app", "only this app's", _string(APP_NAME, 63))], None),
    ("POST", "/v1/apps/{app}/schedules/{name}/pause"): (
        "Pause a function's schedule: its ticks pass unrun until resumed",
        (200, "the schedule", _ref("ScheduleView"), JSON), (400, 404, 409, 413), [], None),
    ("POST", "/v1/apps/{app}/schedules/{name}/resume"): (
        "Resume a function's schedule from its next tick (the ticks that passed are not caught up)",
        (200, "the schedule", _ref("ScheduleView"), JSON), (400, 404, 409, 413), [], None),
    ("POST", "/v1/apps/{app}/schedules/{name}/run"): (
        "Run a scheduled function now, outside its schedule: an ordinary spawned call",
        (202, "the call queued", _ref("ScheduleRun"), JSON), (400, 404, 413, 429, 503), [], None),
    ("GET", "/v1/status"): (
        "Nodes, GPUs, replicas and services", (200, "the cluster", _ref("StatusView"), JSON), (404,),
        [_query("app", "only this app's services", {"type": "string"}), _SERVICE_QUERY], None),
    ("GET", "/v1/calls/{call_id}"): (
        "A queued call's record", (200, "the record", _ref("CallRecord"), JSON), (400, 404),
        [_query("wait", "long-poll up to this many seconds until the call is final",
                {"type": "number", "minimum": 0, "maximum": 300})], None),
    ("DELETE", "/v1/calls/{call_id}"): (
        "Cancel a queued or running call: an async function's task is cancelled, a generator closed at its next item, "
        "a sync function told through ember.current_call().cancelled", (200, "the cancelled record",
                                                                      _ref("CallRecord"), JSON), (400, 404, 409),
        [_query("terminate", "also stop and replace the replica running it (its other calls are retried elsewhere)",
                {"type": "boolean"})], None),
    ("POST", "/v1/tokens"): (
        "Create a token (admin); the answer is the only time the token is shown",
        (201, "the token and its record", _ref("NewToken"), JSON), (400, 413, 422), [],
        _json_body(_ref("TokenRequest"))),
    ("GET", "/v1/tokens"): ("List the live tokens (admin); never their secrets",
                            (200, "the tokens' records", _ref("TokenList"), JSON), (), [], None),
    ("GET", "/v1/tokens/self"): ("The calling token's record: what it may do",
                                 (200, "its record", _ref("TokenInfo"), JSON), (), [], None),
    ("DELETE", "/v1/tokens/{token_id:token}"): (
        "Revoke a token (admin): it fails at its next request", (200, "the revoked token's record",
                                                                  _ref("TokenInfo"), JSON), (400, 404), [], None),
    ("GET", "/v1/quotas"): ("List the quotas, with what each uses now (admin)",
                            (200, "the quotas and their usage", _ref("QuotaList"), JSON), (), [], None),
    ("PUT", "/v1/quotas/{quota}"): ("Set a quota (admin)", (200, "the quota", _ref("Quota"), JSON),
                                    (400, 413, 422), [], _json_body(_ref("QuotaRequest"))),
    ("DELETE", "/v1/quotas/{quota}"): ("Remove a quota (admin)", (200, "the removed quota", _ref("Quota"), JSON),
                                       (404, 422), [], None),
    ("GET", "/v1/subjects"): ("List the subject grants (admin): what apps may bind beyond events.<app>",
                              (200, "the grants", _ref("SubjectGrantList"), JSON), (), [], None),
    ("POST", "/v1/subjects/grant"): (
        "Let apps bind subjects inside a pattern (admin), checked at their next push",
        (200, "the grant", _ref("SubjectGrant"), JSON), (400, 413, 422, 503), [],
        _json_body({"allOf": [_ref("SubjectGrantRequest"), {"required": ["apps"], "properties": {
            "apps": {"minItems": 1}}}]})),
    ("POST", "/v1/subjects/revoke"): (
        "Take a pattern back from apps (admin; no apps: from all), checked at their next push",
        (200, "what is left of the grant (null: nothing)", _ref("SubjectGrantLeft"), JSON), (400, 404, 413, 422, 503),
        [], _json_body(_ref("SubjectGrantRequest"))),
    ("GET", "/v1/secrets"): ("List the secrets (admin): names, keys, times and app patterns, never values",
                             (200, "the secrets", _ref("SecretList"), JSON), (503,), [], None),
    ("PUT", "/v1/secrets/{secret}"): ("Set a secret (admin): its keys, values and app patterns, replacing any before",
                                      (200, "the secret, without values", _ref("SecretView"), JSON),
                                      (400, 413, 422, 503), [], _json_body(_ref("SecretRequest"))),
    ("DELETE", "/v1/secrets/{secret}"): ("Remove a secret (admin)", (204, "removed", None, JSON), (404, 422, 503),
                                         [], None),
    ("PUT", "/v1/volumes/-/chunks/{sha256:chunk}"): (
        "Upload one chunk of a volume's file, addressed by its sha256 (checked)",
        (201, "stored (200: it was there already)", _ref("BundleReply"), JSON), (400, 403, 413, 422),
        [_query("volume", "the volume it is for (an admin's upload is then recorded for that volume alone)",
                {"type": "string", "maxLength": 128})],
        {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                             "format": "binary"}}}}),
    ("POST", "/v1/volumes/-/chunks/missing"): (
        "Which of these chunks the platform lacks", (200, "the missing ones, in order", _ref("ChunksMissing"), JSON),
        (400, 413, 422), [], _json_body(_ref("ChunksQuery"))),
    ("POST", "/v1/volumes/{volume}/versions"): (
        "A new version of a volume, made of stored chunks", (201, "the volume", _ref("VolumeView"), JSON),
        (400, 409, 413, 422), [], _json_body(_ref("VolumeCommit"))),
    ("GET", "/v1/volumes"): ("List the volumes the token sees, each with its latest version",
                             (200, "the volumes", _ref("VolumeList"), JSON), (), [], None),
    ("GET", "/v1/volumes/{volume}"): ("A volume: its latest version's files, the versions kept, who mounts it",
                                      (200, "the volume", _ref("VolumeView"), JSON), (404, 422), [], None),
    ("DELETE", "/v1/volumes/{volume}"): (
        "Remove a volume, every version of it and the chunks nothing else uses",
        (204, "removed", None, JSON), (404, 409, 422), [], None),
    **openapi_oip.OPERATIONS,
    **openapi_openai.OPERATIONS,
    **events.OPERATIONS,
    ("POST", "/v1/{app}/{name}/spawn"): (
        "Queue a call durably (`{app}` may be `<app>@<version>`: the call waits for that version)",
        (202, "queued", _ref("SpawnReply"), JSON), _SPAWN_ERRORS, [_TIMEOUT, _IDEMPOTENCY_KEY], _json_body({})),
    ("POST", "/v1/{app}/{name}"): (
        "Call a function; the body is its input (`{app}` may be `<app>@<version>` to pin a running version)",
        (200, "the function's JSON result", {}, JSON), _CALL_ERRORS, [_TIMEOUT], _json_body({})),
}


# Answers that are streams beside their JSON: each media type a route may answer, with what one event or line is.
_STREAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/v1/apps/{app}/logs"): {  # with follow=true: open until the client leaves
        "text/event-stream": {"schema": {  # one event
            "type": "object", "required": ["event", "data"], "description": "Server-Sent Events: `line` (data: a "
            "LogLine), `dropped` ({\"dropped\": n}), `error` (an ErrorBody); comments as keep-alives",
            "properties": {"event": {"enum": ["line", "dropped", "error"]},
                           "data": {"type": "string", "contentMediaType": "application/json"}}}},
        "application/x-ndjson": {"schema": {"type": "string", "description": "one JSON object per line: a LogLine, "
                                            "or {\"event\": \"dropped\"|\"error\", ...}; empty lines as "
                                            "keep-alives"}},
    },
    **openapi_openai.STREAMS,
}


def _operation(method: str, path: str, need: str | None = None) -> dict[str, Any]:
    op = _OPERATIONS.get((method, path))
    if op is None:  # a route without an entry above: documented all the same, with what every route has
        op = (f"{method} {path}", (200, "the answer", {}, JSON), (), [], None)
    summary, (status, description, schema, media), errors, params, body = op
    if path.endswith("}/spawn") or path == "/v1/{app}/{name}":
        answer = _answer(description, schema, media, _CALL_HEADERS if status == 200 else None)
    else:
        answer = _answer(description, schema, media)
    if (method, path) in _STREAMS:
        answer.setdefault("content", {}).update(_STREAMS[method, path])
    path_params = [{"name": name, "in": "path", "required": True, "description": _PATH_PARAMS[name][0],
                    "schema": _PATH_PARAMS[name][1]} if name in _PATH_PARAMS else
                   {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                   for name in re.findall(r"\{(\w+)(?::\w+)?\}", path)]
    if need != OPEN:
        errors = tuple(sorted({*errors, 401, *((403,) if need != "token" else ())}))
    error_body = _ref("OipError" if path == "/v2" or path.startswith("/v2/") else  # the protocols' own
                      "OpenAIError" if path.startswith("/openai/") else "ErrorBody")
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()} {_CONVERTER.sub(_BARE, path)}", "summary": summary,
        "responses": {str(status): answer,
                      **{str(code): _answer(_ERRORS[code], error_body) for code in errors}},
    }
    if need == OPEN:
        operation["security"] = []
    elif need is not None:
        operation["description"] = f"Needs a bearer token{_NEEDS.get(need, '')}."
    if path_params or params:
        operation["parameters"] = [*path_params, *params]
    if body is not None:
        operation["requestBody"] = body
    return operation


def _components() -> dict[str, Any]:
    """The bodies' schemas from their Structs, and the Structs they refer to."""
    names = list(_BODIES)
    tops, schemas = msgspec.json.schema_components([_documented(_BODIES[n]) for n in names], ref_template=REF)
    for name, top in zip(names, tops, strict=True):
        if top != _ref(name):  # a list of Structs, or a Struct whose class has another name
            schemas[name] = top
    return {**schemas, **_PLAIN}


def _documented(kind: Any) -> Any:
    """``kind``, or a copy of its Struct whose ``msgspec.Raw`` defaults read ``None`` (raw JSON ``null``): msgspec
    cannot write a Raw default into a schema."""
    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return kind
    fields = msgspec.structs.fields(kind)
    if not any(isinstance(f.default, msgspec.Raw) for f in fields):
        return kind
    config = kind.__struct_config__
    copy = msgspec.defstruct(
        kind.__name__,
        [(f.name, f.type) if f.required else (f.name, f.type, msgspec.field(
            default=None if isinstance(f.default, msgspec.Raw) else f.default, name=f.encode_name))
         if f.default is not msgspec.NODEFAULT else
         (f.name, f.type, msgspec.field(default_factory=f.default_factory, name=f.encode_name)) for f in fields],
        kw_only=True, frozen=config.frozen, forbid_unknown_fields=config.forbid_unknown_fields,
        array_like=config.array_like, module=kind.__module__)
    copy.__doc__ = kind.__doc__
    return copy


def static_document(routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """The document for ``routes``, without the deployed functions' paths."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            paths.setdefault(_CONVERTER.sub(_BARE, route.path), {})[method.lower()] = _operation(
                method, route.path, getattr(route.endpoint, NEED, None))
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "Ember", "version": ember.__version__,
                 "description": "Ember's HTTP API. Every error answers {\"error\": {...}} (ErrorBody). Every route "
                                "but /healthz and /readyz needs Authorization: Bearer <token>."},
        "paths": paths,
        "components": {"schemas": _components(), "securitySchemes": {"bearer": _BEARER}},
        "security": [{"bearer": []}],
    }


# -- the route ----------------------------------------------------------------------------------------------------


class _Cache:
    """The static document per route table, and the encoded documents for the last few sets of deployments they
    were built from (tokens that see different apps are shown different documents)."""

    KEPT = 16

    def __init__(self) -> None:
        self.static: dict[Any, dict[str, Any]] = {}
        self.bodies: dict[Any, bytes] = {}

    def document(self, routes: Sequence[BaseRoute], deployments: Mapping[str, Deployment]) -> bytes:
        table = tuple((r.path, frozenset(r.methods or ())) for r in routes if isinstance(r, Route))
        key = (table, tuple((app, dep.version, dep.created_at) for app, dep in sorted(deployments.items())))
        body = self.bodies.get(key)
        if body is None:
            static = self.static.get(table)
            if static is None:
                static = self.static[table] = static_document(routes)
            body = encoder.encode(build(static, deployments))
            if len(self.bodies) >= self.KEPT:
                del self.bodies[next(iter(self.bodies))]
            self.bodies[key] = body
        return body


def build(static: dict[str, Any], deployments: Mapping[str, Deployment]) -> dict[str, Any]:
    """The whole document: ``static`` and the deployed functions' paths. The templated call paths then stand for
    the apps not deployed (an app served later, or ``<app>@<version>``): a deployed app's functions take what
    their own paths say, not any JSON."""
    paths, schemas = function_paths(deployments)
    templated = {path: _other_apps(static["paths"][path], sorted(deployments)) for path in _TEMPLATED_CALLS
                 if deployments and path in static["paths"]}
    return {**static, "paths": {**static["paths"], **templated, **paths},
            "components": {"schemas": {**static["components"]["schemas"], **schemas}}}


_TEMPLATED_CALLS = ("/v1/{app}/{name}", "/v1/{app}/{name}/spawn")


def _other_apps(item: dict[str, Any], apps: list[str]) -> dict[str, Any]:
    """A copy of a templated call path whose ``{app}`` is none of ``apps``."""
    def narrowed(param: dict[str, Any]) -> dict[str, Any]:
        if param.get("in") != "path" or param.get("name") != "app":
            return param
        return {**param, "schema": {"allOf": [param["schema"], {"not": {"enum": apps}}]}}
    return {method: {**op, "parameters": [narrowed(p) for p in op.get("parameters", [])]}
            for method, op in item.items()}


_cache = _Cache()


async def document(request: Request) -> Response:
    """``GET /openapi.json``: the API, with a path per deployed function the token sees. Query parameters are
    ignored."""
    principal = principal_of(request)
    deployments = {app: dep for app, dep in platform_of(request).registry.deployments.items.items()
                   if principal.sees(app)}
    return Response(_cache.document(request.app.routes, deployments), media_type=JSON)
