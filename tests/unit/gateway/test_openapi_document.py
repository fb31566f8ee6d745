"""The OpenAPI document, built without a server: every route of the table, valid OpenAPI 3.1, and a path per
deployed function whose body is that function's input schema."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
import schemathesis

from ember.wire import Deployment, FunctionSpec, Manifest, ServiceSpec
from ember_platform.gateway import openapi
from ember_platform.gateway.asgi import ROUTES


class Point(msgspec.Struct):
    x: float
    y: float


def _deployment(app: str, *functions: FunctionSpec, version: int = 1) -> Deployment:
    service = ServiceSpec(name="svc", kind="function", functions=list(functions))
    return Deployment(app=app, version=version, bundle_sha256="0" * 64, created_at=float(version),
                      manifest=Manifest(app=app, module=app, services=[service]))


def _function(name: str, kind: Any, output: Any = float) -> FunctionSpec:
    return FunctionSpec(name=name, attr=name, input_mode="single", input_schema=msgspec.json.schema(kind),
                        output_schema=msgspec.json.schema(output))


def _valid(document: dict[str, Any]) -> None:
    schemathesis.openapi.from_dict(document).validate()


def _resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*([node["$ref"]] if isinstance(node.get("$ref"), str) else []), *(r for v in node.values()
                                                                                  for r in _refs(v))]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_route_appears_with_its_methods():
    paths = openapi.static_document(ROUTES)["paths"]
    for route in ROUTES:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # starlette's {path:rest} is OpenAPI's {path}
        assert path in paths, route.path
        for method in route.methods - {"HEAD"}:
            operation = paths[path][method.lower()]
            assert operation["responses"], (method, route.path)
            for name in re.findall(r"\{(\w+)\}", path):
                assert any(p["name"] == name and p["in"] == "path" for p in operation["parameters"])


def test_every_route_has_its_own_entry():
    # A route missing from the table is documented all the same, but with a generic answer: keep the table whole.
    table = {(method, route.path) for route in ROUTES for method in route.methods - {"HEAD"}}
    assert table == set(openapi._OPERATIONS)


def test_the_static_document_is_valid_openapi_and_every_reference_resolves():
    document = openapi.static_document(ROUTES)
    assert document["openapi"].startswith("3.1")
    _valid(document)
    for ref in _refs(document):
        assert _resolve(document, ref) is not None


def test_errors_have_the_one_shape():
    """Ember's errors are ErrorBody; the Open Inference Protocol's (/v2) are the protocol's own {"error": message},
    as they answer (a /v2 404 declared as ErrorBody was schemathesis' ST108); OpenAI's routes (/openai) answer
    OpenAI's {"error": {"message", "type", "param", "code"}}."""
    document = openapi.static_document(ROUTES)
    schemas = document["components"]["schemas"]
    assert schemas["ErrorBody"]["required"] == ["error"]
    assert set(schemas["ErrorInfo"]["properties"]) == {"code", "message", "field", "type", "retry_after_s", "call_id"}
    assert schemas["OipError"]["properties"] == {"error": {"type": "string"}}
    assert set(schemas["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}
    for path, operations in document["paths"].items():
        body = "OipError" if path == "/v2" or path.startswith("/v2/") else \
            "OpenAIError" if path.startswith("/openai/") else "ErrorBody"
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if int(status) >= 400:
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": f"#/components/schemas/{body}"}, (method, path, status)


def test_an_invalid_document_is_refused():  # the check above checks something
    document = openapi.static_document(ROUTES)
    with pytest.raises(Exception, match="info"):
        _valid({k: v for k, v in document.items() if k != "info"})


def test_each_deployed_function_has_its_paths_with_its_input_schema():
    deployments = {"geo": _deployment("geo", _function("norm", Point), _function("Model.predict", list[int], str))}
    document = openapi.build(openapi.static_document(ROUTES), deployments)
    _valid(document)
    for ref in _refs(document):
        assert _resolve(document, ref) is not None, ref
    assert "/v1/{app}/{name}" in document["paths"] and "/v1/{app}/{name}/spawn" in document["paths"]
    norm = document["paths"]["/v1/geo/norm"]["post"]
    point = _resolve(document, norm["requestBody"]["content"]["application/json"]["schema"]["$ref"])
    assert point["required"] == ["x", "y"] and point["properties"]["x"] == {"type": "number"}
    assert norm["responses"]["200"]["content"]["application/json"]["schema"] == {"type": "number"}
    spawn = document["paths"]["/v1/geo/norm/spawn"]["post"]
    assert spawn["requestBody"] == norm["requestBody"] and "202" in spawn["responses"]
    predict = document["paths"]["/v1/geo/Model.predict"]["post"]
    assert predict["requestBody"]["content"]["application/json"]["schema"] == {"type": "array",
                                                                               "items": {"type": "integer"}}


@pytest.mark.parametrize("schema", [
    {"$ref": "http://elsewhere.example/schema.json"},
    {"$ref": "#/$defs/Missing", "$defs": {"Other": {"type": "string"}}},
    {"$id": "http://elsewhere.example/", "$schema": "x", "type": "object", "$defs": "not a dict"},
    {"$defs": {"a b/c~": {"type": "integer"}}, "$ref": "#/$defs/a b/c~"},
    {"type": "object", "properties": {"x": {"$ref": 5}}},
    {"allOf": [{"$ref": "#/$defs/N"}]},
    True,
])
def test_a_hostile_manifest_schema_still_gives_a_valid_document(schema):
    spec = FunctionSpec(name="f", attr="f", input_mode="single", input_schema=schema, output_schema=schema)
    document = openapi.build(openapi.static_document(ROUTES), {"x": _deployment("x", spec)})
    _valid(document)
    for ref in _refs(document):
        assert ref.startswith("#/components/schemas/") and _resolve(document, ref) is not None, ref


def test_a_schema_too_deep_to_walk_is_any_json():
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"items": deep}
    spec = FunctionSpec(name="f", attr="f", input_mode="single", input_schema=deep)
    paths, _ = openapi.function_paths({"x": _deployment("x", spec)})
    assert paths["/v1/x/f"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {}


def test_the_encoded_document_follows_the_deployments():
    cache = openapi._Cache()
    first = cache.document(ROUTES, {"a": _deployment("a", _function("f", int))})
    assert cache.document(ROUTES, {"a": _deployment("a", _function("f", int))}) is first  # kept
    second = cache.document(ROUTES, {"a": _deployment("a", _function("g", int), version=2)})
    paths = msgspec.json.decode(second)["paths"]
    assert "/v1/a/g" in paths and "/v1/a/f" not in paths
    assert "/v1/a/f" not in msgspec.json.decode(cache.document(ROUTES, {}))["paths"]


def test_the_logs_route_declares_its_streams():
    """With follow=true the answer is a stream that stays open (schemathesis read it to a timeout): the document
    says which media types it may be, beside the JSON list of kept lines."""
    answer = openapi.static_document(ROUTES)["paths"]["/v1/apps/{app}/logs"]["get"]["responses"]["200"]
    assert set(answer["content"]) == {"application/json", "text/event-stream", "application/x-ndjson"}
