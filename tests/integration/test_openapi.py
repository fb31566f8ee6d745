"""``GET /openapi.json`` against the running platform: a valid OpenAPI 3.1 document of every route and of the
deployed functions, that hostile query strings do not break; then schemathesis, generating requests from that
document for every operation, finds no 5xx and only errors in the one JSON shape.

The schemathesis run is bounded: ``MAX_EXAMPLES`` requests per operation and generation mode (valid requests, then
requests that break the schema), derandomized (the same requests every run), no shrinking, no example database.
Operations that change state other tests share (deleting an app, scaling, deploying, replaying dead letters) never
name a deployed app: a generated name of one is replaced by a name that is not deployed, so that ``DELETE
/v1/apps/{app}`` is sent hostile names but never deletes ``hello``; the run sends the admin token and never revokes
it. Calls of the deployed functions (``POST /v1/hello/greet`` and its ``/spawn``) do run: they are what the concrete
paths are for. Two 5xx answers are
documented and accepted, each only where it applies: 500 ``user_error`` when a deployed function's own code raises
(the test apps' functions raise by design), and 504 for a call given a deadline under ``SHORT_DEADLINE_S``.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from support.auth import bearer

from ember.wire import HTTP_TIMEOUT_HEADER, RESERVED_APP_NAMES
from ember_platform.gateway.asgi import ROUTES

pytestmark = pytest.mark.integration
ERROR_KEYS = {"code", "message", "field", "type", "retry_after_s", "call_id"}
MAX_EXAMPLES = 10
BOUNDED = settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
                   phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
# (method, path) of the operations whose {app} is never a deployed app (see the module's docstring).
SHARED_STATE = {("DELETE", "/v1/apps/{app}"), ("POST", "/v1/apps/{app}/scale"),
                ("POST", "/v1/apps/{app}/deployments"), ("POST", "/v1/apps/{app}/dead/replay"),
                ("POST", "/v1/apps/{app}/promote"), ("POST", "/v1/apps/{app}/rollback")}
NOT_DEPLOYED = "openapi-not-deployed"
# A call given a deadline shorter than this may end 504 (deadline_exceeded), the documented answer to a deadline no call
# can meet, not a server fault (see test_a_deadline_too_short_for_any_call_is_a_504).
SHORT_DEADLINE_S = 0.5


def _error_shape(response: httpx.Response | requests.Response) -> str | None:
    """Why an error answer is not in the one JSON shape; None when it is (or it is no error)."""
    if response.status_code < 400:
        return None
    kind = response.headers.get("content-type") or ""
    kind = kind[0] if isinstance(kind, list) else kind  # schemathesis' answers hold a list per header
    if not kind.startswith("application/json"):
        return f"content-type {kind!r}"
    try:
        body = response.json()
    except ValueError:
        return "not JSON"
    path = getattr(response, "url", None) or getattr(getattr(response, "request", None), "url", "")
    if "/v2/" in str(path) or str(path).endswith("/v2"):  # the Open Inference Protocol's own shape
        ok = isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)
        return None if ok else f"not the Open Inference Protocol's error shape: {str(body)[:200]}"
    if not (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict)
            and set(body["error"]) == ERROR_KEYS and isinstance(body["error"]["code"], str)
            and isinstance(body["error"]["message"], str)):
        return f"not the error shape: {str(body)[:200]}"
    return None


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


def test_schemathesis_finds_no_server_error(platform, hello, http):
    schema = schemathesis.openapi.from_url(f"{platform.url}/openapi.json", headers=bearer(platform.token))
    schema.validate()
    deployed = {app["app"] for app in http.get("/v1/apps").json()}
    failures: list[str] = []
    operations = 0
    seen: list[str] = []
    sent = [0]
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {platform.token}"  # an admin token: every operation is reached
        for result in schema.get_all_operations():
            operation = result.ok()
            segments = operation.path.split("/")
            if segments[1] == "v1" and len(segments) > 2 and segments[2] not in (*RESERVED_APP_NAMES, "{app}", "hello"):
                continue  # other tests' apps (they allocate, sleep, crash by design) are theirs to exercise
            operations += 1
            seen.append(f"{operation.method.upper()} {operation.path}")
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    _run(operation, mode, session, platform.url, deployed, sent,
                         {http.get("/v1/tokens/self").json()["id"]})
                except Unsatisfiable:  # nothing to break: no parameters and no body
                    assert mode is GenerationMode.NEGATIVE, operation.path
                except Exception as exc:
                    failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}")
    print(f"schemathesis: {operations} operations, {sent[0]} requests")
    # every route but GET /openapi.json (schemathesis leaves out the operation that serves its schema; the tests
    # above send it hostile input), and the hello functions' calls and spawns
    assert operations >= len(ROUTES) - 1 + 8, seen
    assert sent[0] >= operations * MAX_EXAMPLES, sent  # it did send the requests
    assert not failures, "\n".join(failures)


def _run(operation: Any, mode: GenerationMode, session: requests.Session, url: str, deployed: set[str],
         sent: list[int], own_ids: set[str]) -> None:
    @BOUNDED
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        if (case.method.upper(), case.path) in SHARED_STATE and case.path_parameters.get("app") in deployed:
            case.path_parameters["app"] = NOT_DEPLOYED
        if case.path == "/v1/tokens/{token_id}" and case.path_parameters.get("token_id") in own_ids:
            case.path_parameters["token_id"] = "0"  # never revoke the token this run authenticates with
        if case.path == "/v1/apps/{app}/logs" and isinstance(case.query, dict):
            case.query.pop("follow", None)  # a followed stream never ends by itself (test_logs_follow covers it)
        response = case.call(base_url=url, session=session, timeout=30)
        sent[0] += 1
        what = (f"{case.method} {response.request.url} {dict(response.request.headers)} "
                f"{(response.request.body or b'')[:200]!r} -> {response.status_code}: {response.text[:300]}")
        if response.status_code in (503, 504) and _short_deadline(case.headers):
            assert response.json()["error"]["code"] == "deadline_exceeded", what
            return
        if response.status_code == 500 and response.json()["error"]["code"] == "user_error":
            # A deployed function's own code raised (the test apps' do, by design): the answer designed for it.
            assert case.path.split("/")[2] not in RESERVED_APP_NAMES, what
            return
        assert response.status_code < 500, what
        problem = _error_shape(response)
        assert problem is None, f"{what} ({problem})"

    check()


def _short_deadline(headers: dict[str, Any] | None) -> bool:
    raw = {k.lower(): v for k, v in (headers or {}).items()}.get(HTTP_TIMEOUT_HEADER.lower())
    try:
        return raw is not None and 0 < float(raw) < SHORT_DEADLINE_S
    except (TypeError, ValueError):
        return False


def test_a_deadline_too_short_for_any_call_is_a_400_the_document_states(hello, http):
    """A timeout no call could be served within is the client's mistake, said before anything runs (it was a 504
    after running nothing: schemathesis' ST101); the document states the least one."""
    response = http.post("/v1/hello/greet", json="Ada", headers={HTTP_TIMEOUT_HEADER: "5e-324"})
    assert _error_shape(response) is None
    assert response.status_code == 400 and response.json()["error"]["field"] == HTTP_TIMEOUT_HEADER, response.text
    call = http.get("/openapi.json").json()["paths"]["/v1/hello/greet"]["post"]
    (timeout,) = [p for p in call["parameters"] if p["name"] == HTTP_TIMEOUT_HEADER]
    assert timeout["schema"] == {"type": "number", "minimum": 0.001}
