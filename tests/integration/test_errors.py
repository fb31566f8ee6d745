"""Every error status of the invocation API, with one JSON shape, and the SDK's typed exceptions."""

from __future__ import annotations

import httpx
import pytest
from support.paths import REPO

import ember

pytestmark = pytest.mark.integration
ERROR_KEYS = {"code", "message", "field", "type", "retry_after_s", "call_id"}


def error_of(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    assert body["error"]["code"] == code
    return body["error"]


def test_unknown_app_and_function_are_404(hello, http):
    error_of(http.post("/v1/nosuchapp/greet", json="x"), 404, "not_found")
    err = error_of(http.post("/v1/hello/nosuchfn", json="x"), 404, "not_found")
    assert "greet" in err["message"]  # says what exists


@pytest.mark.parametrize("path", ["/v1/apps/hello", "/v1/calls/abc", "/v1/status/x", "/v1/bundles/x",
                                  "/v1/apps/hello/spawn", "/v1/calls/x/spawn"])
def test_a_post_to_an_api_route_is_never_taken_for_a_call(hello, http, path):
    """``/v1/<app>/<fn>`` must not shadow the API's own routes: these are 405, not calls to an app named "apps"."""
    error_of(http.post(path, json={}), 405, "method_not_allowed")


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("TRACE", "/v1/hello/greet", "OPTIONS, POST"),
    ("GET", "/v1/hello/greet", "OPTIONS, POST"),
    ("PUT", "/v1/apps/hello", "DELETE, GET, HEAD, OPTIONS"),  # two routes of one path: both methods
    ("PATCH", "/v1/calls/abc", "DELETE, GET, HEAD, OPTIONS"),
    ("POST", "/healthz", "GET, HEAD, OPTIONS"),
    ("DELETE", "/v2/models/hello.greet/infer", "OPTIONS, POST"),
    ("POST", "/v2/health/live", "GET, HEAD, OPTIONS"),  # a path the protocol has: not its 404 for any other
    ("PUT", "/v2/models", "GET, HEAD, OPTIONS"),
    ("PUT", "/v2/no/such/path", "GET, HEAD, OPTIONS, POST"),  # the protocol answers any other path (its 404)
    ("PUT", "/v1/volumes/-/chunks/missing", "OPTIONS, POST"),  # not the chunk route's: no chunk is named so
    ("DELETE", "/v1/tokens/self", "GET, HEAD, OPTIONS"),  # nor a token
])
def test_a_method_a_path_does_not_take_is_a_405_that_says_which_it_takes(hello, http, method, path, allowed):
    """RFC 9110: a 405 carries ``Allow``, every method of the path; OPTIONS answers with it too."""
    response = http.request(method, path)
    if path.startswith("/v2/"):  # the Open Inference Protocol's own error shape, {"error": "<message>"}
        assert response.status_code == 405 and response.json()["error"].endswith(f"allowed: {allowed}")
    else:
        assert error_of(response, 405, "method_not_allowed")["message"].endswith(f"allowed: {allowed}")
    assert response.headers["allow"] == allowed
    options = http.request("OPTIONS", path)
    assert (options.status_code, options.headers["allow"], options.content) == (204, allowed, b"")


def test_an_app_may_not_take_the_name_of_an_api_route(hello, http):
    manifest = {"app": "apps", "module": "m", "services": [{"name": "f", "kind": "function", "functions": [
        {"name": "f", "attr": "f", "input_mode": "none"}]}]}
    response = http.post("/v1/apps/apps/deployments", json={"bundle_sha256": "0" * 64, "manifest": manifest})
    assert error_of(response, 422, "invalid_input")["field"] == "$.manifest.app"


def test_wrong_input_type_is_422_naming_the_field(probe, hello, http):
    assert error_of(http.post("/v1/hello/greet", json=5), 422, "invalid_input")["field"] == "$"
    assert error_of(http.post("/v1/hello/norm", json={"x": 1, "y": "2"}), 422, "invalid_input")["field"] == "$.y"
    assert error_of(http.post("/v1/hello/add", json={"b": 1}), 422, "invalid_input")["field"] == "$.a"
    assert error_of(http.post("/v1/hello/add", json={"a": 1, "z": 1}), 422, "invalid_input")["field"] == "$.z"


def test_digits_rejects_a_short_image(deployed, http):
    deployed(REPO / "examples" / "digits" / "classifier.py")
    err = error_of(http.post("/v1/digits/Classifier.predict", json={"pixels": [1.0] * 10}), 422, "invalid_input")
    assert err["field"] == "$.pixels"
    err = error_of(http.post("/v1/digits/Classifier.predict", json={"pixels": [99.0] * 64}), 422, "invalid_input")
    assert err["field"] == "$.pixels[0]"


def test_malformed_json_is_400(hello, http):
    error_of(http.post("/v1/hello/greet", content=b"{not json"), 400, "bad_request")
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000  # valid JSON too deep to parse: refused, not a crash
    error_of(http.post("/v1/hello/echo", content=deep), 400, "bad_request")


def test_body_over_the_limit_is_413_before_reading_it(hello, http):
    big = b'"' + b"x" * (5 * 1024 * 1024) + b'"'
    error_of(http.post("/v1/hello/greet", content=big), 413, "payload_too_large")

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(6):
            yield b"x" * (1024 * 1024)

    error_of(http.post("/v1/hello/greet", content=chunks()), 413, "payload_too_large")


def test_user_exception_is_500_with_its_type_and_message(probe, http, ember_url):
    err = error_of(http.post("/v1/probe/boom", json="kaput"), 500, "user_error")
    assert err["type"] == "ValueError" and err["message"] == "kaput" and err["call_id"]
    with pytest.raises(ember.RemoteError) as info:
        ember.lookup("probe", "boom").remote("again")
    assert info.value.remote_type == "ValueError" and info.value.message == "again"


def test_wrong_batch_output_length_is_a_clear_error(probe, http):
    err = error_of(http.post("/v1/probe/wrong_length", json=1), 500, "user_error")
    assert "1 inputs" in err["message"]


def test_deadline_passed_is_504(probe, http, ember_url):
    # a 504 at the deadline: waiting for nap(3.0) to finish would have answered 200
    error_of(http.post("/v1/probe/nap", json=3.0, headers={"X-Ember-Timeout": "0.5"}), 504, "deadline_exceeded")
    with pytest.raises(ember.DeadlineExceededError):
        ember._client.default_transport().invoke("probe", "nap", b"3.0", timeout_s=0.5)


@pytest.mark.parametrize("timeout", ["soon", "0", "-1", "5e-324", "0.001", "0.0499", "inf", "nan", ""])
def test_bad_timeout_header_is_400(hello, http, timeout):
    """Before any call: a timeout too small to serve anything (5e-324) was a 504 after running nothing."""
    err = error_of(http.post("/v1/hello/greet", json="x", headers={"X-Ember-Timeout": timeout}), 400, "bad_request")
    assert err["field"] == "X-Ember-Timeout" and "at least 0.05" in err["message"]


def test_the_least_timeout_header_is_taken(hello, http):
    assert http.post("/v1/hello/add", json={"a": 1}, headers={"X-Ember-Timeout": "0.05"}).status_code in (200, 504)


def test_no_ready_replica_is_503_with_retry_after(deployed, transport, http):
    ember.deploy(REPO / "tests" / "apps" / "probe" / "slowstart.py", transport=transport, wait=False)
    try:
        response = http.post("/v1/slowstart/Sleeper.ping", headers={"X-Ember-Timeout": "1"})
        error_of(response, 503, "unavailable")
        assert int(response.headers["retry-after"]) >= 1
    finally:
        transport.request("DELETE", "/v1/apps/slowstart")


def test_sdk_raises_embers_own_errors(hello, ember_url, monkeypatch):
    with pytest.raises(ember.NotFoundError):
        ember.lookup("hello", "nosuchfn").remote(1)
    with pytest.raises(ember.InvalidInputError) as info:
        ember.lookup("hello", "norm").remote({"x": 1})
    assert info.value.field == "$.y"
    monkeypatch.setenv("EMBER_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ember.ConnectionError):
        ember.lookup("hello", "greet").remote("x")
