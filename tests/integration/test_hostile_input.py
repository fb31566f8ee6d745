"""Every route of the gateway, sent hostile path segments, query values and headers: never a 5xx, and every
error answer has the one JSON error shape. Then the findings these probes turned up, one test each."""

from __future__ import annotations

import re

import httpx
import pytest

from ember_platform.gateway.asgi import ROUTES

pytestmark = pytest.mark.integration
ERROR_KEYS = {"code", "message", "field", "type", "retry_after_s", "call_id"}

# Path segments as they travel (percent-encoded): wildcards of NATS subjects, a space, a parent directory, NUL,
# a slash, an overlong name, unicode, dots where a subject token ends.
SEGMENTS = ["%3E", "*", "a%20b", "%2E%2E", "%00", "%2F", "x" * 300, "%C3%A9t%C3%A9", "%E2%98%83", "a.", "a..b",
            "x.%3E", "%25", "%22%7D"]
NUMBERS = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "1e308", "9" * 400, "abc", "", "0x10", "1_0", " 5 "]
# The well-formed value of each path parameter, used while another one is hostile.
VALID = {"app": "hello", "name": "greet", "call_id": "0" * 32, "sha256": "0" * 64, "model": "hello.greet",
         "version": "1", "build_id": "0" * 32}
BODIES: list[bytes | None] = [None, b"{}", b'{"function": "x.>", "call_ids": ["*"]}']


def assert_answer(response: httpx.Response) -> None:
    """Below 500, and an error answer in the one JSON shape."""
    request = response.request
    what = f"{request.method} {request.url.raw_path.decode()} -> {response.status_code}: {response.text[:200]}"
    assert response.status_code < 500, what
    if response.status_code >= 400:
        assert response.headers.get("content-type", "").startswith("application/json"), what
        body = response.json()
        if request.url.path.startswith("/v2/"):  # the Open Inference Protocol's own shape (its 405s too)
            assert set(body) == {"error"} and isinstance(body["error"], str), what
            return
        if request.url.path.startswith("/openai/"):  # OpenAI's
            assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), what
            return
        assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, what
        assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str), what


def error_of(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert_answer(response)
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def _routes() -> list[tuple[str, str]]:
    return [(method, route.path) for route in ROUTES for method in sorted(route.methods or ()) if method != "HEAD"]


def _fill(path: str, hostile: str | None, segment: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: segment if m.group(1) == hostile else VALID[m.group(1)], path)


def _send(http: httpx.Client, method: str, path: str, body: bytes | None = None, **kwargs: object) -> httpx.Response:
    headers = {"content-type": "application/json"} if body is not None else {}
    return http.request(method, path, content=body, headers=headers, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "path"), _routes())
def test_every_route_takes_hostile_path_segments(hello, http, method, path):
    params = re.findall(r"\{(\w+)\}", path)
    for hostile in params or [None]:
        for segment in SEGMENTS if hostile else [""]:
            target = _fill(path, hostile, segment)
            if method == "DELETE" and target == "/v1/apps/hello":
                continue  # the one well-formed delete would remove the app the other tests use
            for body in BODIES if method in ("POST", "PUT") else [None]:
                assert_answer(_send(http, method, target, body))


@pytest.mark.parametrize("value", NUMBERS)
def test_numeric_query_values(hello, http, value):
    for path, name in [("/v1/calls/" + "0" * 32, "wait"), ("/v1/apps/hello/logs", "since"),
                       ("/v1/apps/hello/logs", "limit")]:
        assert_answer(http.get(path, params={name: value}))
    for segment in SEGMENTS:  # percent-encoded already, as in a path
        for path, name in [("/v1/apps/hello/dead", "function"), ("/v1/apps/hello/logs", "service"),
                           ("/v1/status", "app"), ("/v1/status", "service")]:
            assert_answer(http.get(f"{path}?{name}={segment}&since={value}&limit={value}"))


@pytest.mark.parametrize("value", [*(n for n in NUMBERS if n == n.strip()), "1" * 300])  # h11 refuses the rest
def test_hostile_timeout_header(hello, http, value):
    for path in ("/v1/hello/greet", "/v1/hello/greet/spawn"):
        assert_answer(http.post(path, json="Ada", headers={"X-Ember-Timeout": value}))


@pytest.mark.parametrize("key", ["", "k" * 300, "\xe9t\xe9".encode("latin-1"), "*", ">", "a b"])
def test_hostile_idempotency_key(hello, http, key):
    response = http.post("/v1/hello/greet/spawn", json="Ada", headers={"Idempotency-Key": key})
    assert_answer(response)
    if not 0 < len(key) <= 256:
        assert error_of(response, 400, "bad_request")["field"] == "Idempotency-Key"


# -- the findings -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("segment", ["*", "a%20b", "%3E", "%2E%2E", "%00", "a.", "x.%3E", "x" * 600])
def test_a_malformed_call_id_is_400(hello, http, segment):
    for method in ("GET", "DELETE"):
        err = error_of(http.request(method, f"/v1/calls/{segment}"), 400, "bad_request")
        assert err["field"] == "call_id"


@pytest.mark.parametrize("call_id", ["0" * 32, "ember_ev_hello_greet-17", "order=42_x", "a.b", "x" * 300])
def test_a_well_formed_unknown_call_id_is_404(hello, http, call_id):
    for method in ("GET", "DELETE"):
        error_of(http.request(method, f"/v1/calls/{call_id}"), 404, "not_found")


def test_dead_letters_of_an_unknown_function_are_404_and_of_a_malformed_one_400(hello, http):
    err = error_of(http.get("/v1/apps/hello/dead", params={"function": "nosuchfn"}), 404, "not_found")
    assert "greet" in err["message"]  # says what exists
    for bad in ("x.>", "*", "a b", "x..y", "1x"):
        err = error_of(http.get("/v1/apps/hello/dead", params={"function": bad}), 400, "bad_request")
        assert err["field"] == "function"
    assert http.get("/v1/apps/hello/dead", params={"function": "greet"}).status_code == 200


@pytest.mark.parametrize(("name", "value"), [("since", "nan"), ("since", "inf"), ("since", "-inf"), ("since", "-1"),
                                             ("since", "abc"), ("since", "1e400"), ("limit", "-1"), ("limit", "0"),
                                             ("limit", "abc"), ("limit", "1.5"), ("limit", "nan")])
def test_logs_refuse_a_bad_window(hello, http, name, value):
    err = error_of(http.get("/v1/apps/hello/logs", params={name: value}), 400, "bad_request")
    assert err["field"] == name


def test_logs_of_an_unknown_service_are_404_naming_the_services(hello, http):
    err = error_of(http.get("/v1/apps/hello/logs", params={"service": "nosuch"}), 404, "not_found")
    assert "greet" in err["message"]
    ok = http.get("/v1/apps/hello/logs", params={"service": "greet", "since": "0", "limit": "10"})
    assert ok.status_code == 200 and isinstance(ok.json(), list)


def test_an_idempotency_key_with_another_body_is_409(hello, http):
    key = {"Idempotency-Key": "hostile-input-conflict"}
    first = http.post("/v1/hello/greet/spawn", json="Ada", headers=key)
    assert first.status_code == 202, first.text
    again = http.post("/v1/hello/greet/spawn", json="Ada", headers=key)
    assert again.status_code == 202 and again.json()["call_id"] == first.json()["call_id"]
    assert again.json()["created"] is False
    err = error_of(http.post("/v1/hello/greet/spawn", json="Grace", headers=key), 409, "conflict")
    assert err["field"] == "Idempotency-Key" and "another body" in err["message"]


def test_a_deployment_request_has_its_own_body_limit(hello, http):
    body = b"{" + b" " * (1024 * 1024) + b"}"
    error_of(http.post("/v1/apps/hello/deployments", content=body), 413, "payload_too_large")
