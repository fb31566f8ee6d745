"""``GET /openapi.json`` against the running platform: a valid OpenAPI 3.1 document of every route and of the
deployed functions, that hostile query strings do not break. schemathesis' run with every check against it is
test_api_contract.py."""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
from support.contract_checks import error_shape_problem

from ember.wire import HTTP_TIMEOUT_HEADER
from ember_platform.gateway.asgi import ROUTES

pytestmark = pytest.mark.integration


def _error_shape(response: httpx.Response) -> str | None:
    """Why an error answer is not in the one JSON shape; None when it is (or it is no error)."""
    return error_shape_problem(response.status_code, response.headers.get("content-type", ""), response.content,
                               response.url.path)


def test_the_document_is_valid_openapi_with_every_route_and_the_deployed_functions(hello, http):
    response = http.get("/openapi.json")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(document).validate()
    for route in ROUTES:
        for method in route.methods - {"HEAD"}:
            assert method.lower() in document["paths"][re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)], \
                (method, route.path)
    for name in ("greet", "add", "norm", "echo"):
        for path in (f"/v1/hello/{name}", f"/v1/hello/{name}/spawn"):
            assert "post" in document["paths"][path], path
    greet = document["paths"]["/v1/hello/greet"]["post"]
    assert greet["requestBody"]["content"]["application/json"]["schema"] == {"type": "string"}
    assert greet["responses"]["200"]["content"]["application/json"]["schema"] == {"type": "string"}
    norm = document["paths"]["/v1/hello/norm"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    point = document["components"]["schemas"][norm["$ref"].rsplit("/", 1)[1]]
    assert point["required"] == ["x", "y"]


@pytest.mark.parametrize("query", ["", "?", "?a=1", "?%00=%00", "?x=" + "y" * 8000, "?" + "&".join(["a=b"] * 2000),
                                   "?%FF%FE=%E2%98%83", "?a=%", "?refresh=true&format=yaml", "?;;&&==", "?a[]=1&a[]=2"])
def test_hostile_query_strings_do_not_break_the_document(hello, http, query):
    response = http.get("/openapi.json" + query)
    assert response.status_code == 200, response.text[:200]
    assert "/v1/hello/greet" in response.json()["paths"]


def test_the_document_refuses_other_methods_and_ignores_a_body(hello, http):
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = http.request(method, "/openapi.json", content=b'{"x": 1}')
        assert response.status_code == 405 and _error_shape(response) is None, response.text
    assert http.request("GET", "/openapi.json", content=b"\x00" * 1000).status_code == 200
    assert http.head("/openapi.json").status_code == 200


def test_the_document_is_the_same_once_built(hello, http):
    """Built once and served again while no deployment changes (what it costs: bench/openapi.py)."""
    first = http.get("/openapi.json")
    assert first.status_code == 200
    for _ in range(20):
        again = http.get("/openapi.json")
        assert again.status_code == 200 and again.content == first.content


def test_a_deadline_too_short_for_any_call_is_a_400_the_document_states(hello, http):
    """A timeout no call could be served within is the client's mistake, said before anything runs (it was a 504
    after running nothing: schemathesis' ST101); the document states the least one."""
    response = http.post("/v1/hello/greet", json="Ada", headers={HTTP_TIMEOUT_HEADER: "5e-324"})
    assert _error_shape(response) is None
    assert response.status_code == 400 and response.json()["error"]["field"] == HTTP_TIMEOUT_HEADER, response.text
    call = http.get("/openapi.json").json()["paths"]["/v1/hello/greet"]["post"]
    (timeout,) = [p for p in call["parameters"] if p["name"] == HTTP_TIMEOUT_HEADER]
    assert timeout["schema"] == {"type": "number", "minimum": 0.05}
