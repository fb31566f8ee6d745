"""The Open Inference Protocol's routes in the OpenAPI document (``openapi``): their bodies and their entries, in
the shape of ``openapi._OPERATIONS``. Their errors are the protocol's, ``{"error": "<message>"}``."""

from __future__ import annotations

from typing import Any

from ember.wire.oip import (
    IndexRequest,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelReady,
    OipError,
    RepositoryModel,
    ServerMetadata,
)

JSON = "application/json"
BODIES: dict[str, Any] = {
    "InferRequest": InferRequest, "InferResponse": InferResponse, "ModelMetadata": ModelMetadata,
    "ModelReady": ModelReady, "ServerMetadata": ServerMetadata, "RepositoryIndex": list[RepositoryModel],
    "IndexRequest": IndexRequest, "OipError": OipError,
}
PATH_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "model": ("an Open Inference Protocol model: <app>.<function> of a function of arrays",
              {"type": "string", "minLength": 1, "maxLength": 321}),
    "version": ("the app's version", {"type": "string", "pattern": "^[1-9][0-9]{0,11}$"}),
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(name: str, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": _ref(name)}}}


_VERSIONED = ("", "/versions/{version}")
OPERATIONS: dict[tuple[str, str], Any] = {
    ("GET", "/v2"): ("Open Inference Protocol: the server's metadata (errors are {\"error\": message})",
                     (200, "name, version, extensions", _ref("ServerMetadata"), JSON), (401, 403), [], None),
    ("GET", "/v2/health/live"): ("Open Inference Protocol: the server is live", (200, "live", {}, JSON), (), [],
                                 None),
    ("GET", "/v2/health/ready"): ("Open Inference Protocol: the server can take calls (as /readyz)",
                                  (200, "ready (503 when not)", {}, JSON), (), [], None),
    ("POST", "/v2/repository/index"): (
        "Open Inference Protocol: the models of the apps the token sees",
        (200, "the models", _ref("RepositoryIndex"), JSON), (400, 401, 403), [], _body("IndexRequest", False)),
    **{("GET", f"/v2/models/{{model}}{at}"): (
        "Open Inference Protocol: a model's inputs and output", (200, "its metadata", _ref("ModelMetadata"), JSON),
        (401, 403, 404), [], None) for at in _VERSIONED},
    ("GET", "/v2/models"): ("Open Inference Protocol: the names of the models of the apps the token sees",
                            (200, "{\"models\": [name, ...]}", {}, JSON), (401, 403), [], None),
    **{("GET", f"/v2/models/{{model}}{at}/config"): (
        "Open Inference Protocol: the model's configuration as Triton shows one (TYPE_ datatypes, dims)",
        (200, "its configuration", {}, JSON), (401, 403, 404), [], None) for at in _VERSIONED},
    **{("GET", f"/v2/models/{{model}}{at}/ready"): (
        "Open Inference Protocol: whether a replica of the model is ready",
        (200, "ready (503 when not)", _ref("ModelReady"), JSON), (401, 403, 404), [], None) for at in _VERSIONED},
    **{("POST", f"/v2/models/{{model}}{at}/infer"): (
        "Open Inference Protocol: infer (JSON tensors; binary ones after the JSON header, whose length is "
        "Inference-Header-Content-Length)", (200, "the output tensor", _ref("InferResponse"), JSON),
        (400, 401, 403, 404, 413, 415, 429, 500, 503, 504), [], _body("InferRequest")) for at in _VERSIONED},
    **{(method, "/v2/{path:rest}"): ("Open Inference Protocol: any other /v2 path", (404, "not found", None, JSON),
                                     (401, 404), [], None) for method in ("GET", "POST")},
}
