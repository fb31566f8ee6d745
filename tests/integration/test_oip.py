"""The Open Inference Protocol (v2) against the real platform, with Triton's own ``tritonclient.http`` as a user
calls it (``Authorization`` header included): server and model health, metadata, the repository index, inference
with binary and with JSON tensors; and the attacks: wrong datatype, wrong shape, a declared binary size beyond the
body, more elements than data, unknown models and versions, no token, a model of an app the token may not see,
an oversized body.

The apps: tests/apps/arrays (``arrays`` and ``arrays-other``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families
from support.auth import bearer
from support.paths import REPO
from tritonclient.utils import InferenceServerException

from ember.dev.embedded import EmbeddedPlatform

pytestmark = pytest.mark.integration

ARRAYS = REPO / "tests" / "apps" / "arrays" / "arrays.py"
LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def arrays(deployed):
    deployed(ARRAYS, "arrays-other")  # pushed as `ember push` does: numpy imported as written
    return deployed(ARRAYS, "arrays")


@pytest.fixture(scope="module")
def client(platform: EmbeddedPlatform) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url=platform.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture
def auth(platform: EmbeddedPlatform) -> dict[str, str]:
    return bearer(platform.token)  # a fresh dict per test: tritonclient writes its own headers into the one given


def _token(http: httpx.Client, apps: list[str], scopes: list[str]) -> str:
    response = http.post("/v1/tokens", json={"scopes": scopes, "apps": apps, "name": f"oip-{uuid.uuid4().hex[:6]}"})
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def _rows(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4)


def test_tritonclient_checks_health_lists_and_reads_metadata(arrays, client, auth):
    assert client.is_server_live(headers=auth)
    assert client.is_server_ready(headers=auth)
    server = client.get_server_metadata(headers=auth)
    assert server["name"] == "ember" and "binary_tensor_data" in server["extensions"]
    index = {m["name"]: m for m in client.get_model_repository_index(headers=auth)}
    assert index["arrays.scale"] == {"name": "arrays.scale", "version": str(arrays.version), "state": "READY"}
    assert "arrays.echo" not in index  # bytes in, bytes out: not a model
    assert client.is_model_ready("arrays.scale", headers=auth)
    assert client.is_model_ready("arrays.scale", model_version=str(arrays.version), headers=auth)
    meta = client.get_model_metadata("arrays.scale", headers=auth)
    assert meta == {"name": "arrays.scale", "versions": [str(arrays.version)], "platform": "ember",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                               {"name": "factor", "datatype": "FP32", "shape": [1]}],
                    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]}
    untyped = client.get_model_metadata("arrays.counts", headers=auth)
    assert untyped["inputs"] == [{"name": "x", "datatype": "", "shape": [-1]}]
    config = client.get_model_config("arrays.scale", headers=auth)
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]},
                               {"name": "factor", "data_type": "TYPE_FP32", "dims": [1]}]
    assert (config["max_batch_size"], config["output"][0]["name"]) == (0, "output")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_infers(arrays, client, auth, binary):
    x = _rows(3)
    inputs = [triton.InferInput("x", list(x.shape), "FP32"), triton.InferInput("factor", [1], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(np.array([0.5], dtype=np.float32), binary_data=binary)
    outputs = [triton.InferRequestedOutput("output", binary_data=binary)]
    result = client.infer("arrays.scale", inputs, outputs=outputs, request_id="r-1", headers=dict(auth))
    np.testing.assert_array_equal(result.as_numpy("output"), x * 0.5)
    response = result.get_response()
    assert (response["id"], response["model_name"], response["model_version"]) == \
        ("r-1", "arrays.scale", str(arrays.version))
    one = triton.InferInput("x", [2, 4], "FP32")
    one.set_data_from_numpy(_rows(2))
    norms = client.infer("arrays.norms", [one], model_version=str(arrays.version), headers=dict(auth))
    np.testing.assert_allclose(norms.as_numpy("output"), np.linalg.norm(_rows(2), axis=1), rtol=1e-6)


def test_a_batched_function_of_arrays_is_a_model_too(arrays, client, auth, http):
    meta = client.get_model_metadata("arrays.batched_sums", headers=auth)
    assert meta["inputs"] == [{"name": "xs", "datatype": "FP32", "shape": [-1, 4]}]
    given = triton.InferInput("xs", [3, 4], "FP32")
    given.set_data_from_numpy(_rows(3))
    result = client.infer("arrays.batched_sums", [given], headers=dict(auth))
    np.testing.assert_array_equal(result.as_numpy("output"), _rows(3).sum(axis=1))
    assert http.post("/v1/arrays/batched_sums", json=[[1, 2, 3, 4]]).json() == [10.0]


def test_inference_is_counted_in_the_gateways_request_metrics(arrays, client, auth, http):
    def counted(code: str) -> float:
        samples = [s for f in text_string_to_metric_families(http.get("/metrics").text) for s in f.samples]
        labels = {"app": "arrays", "function": "norms", "version": str(arrays.version), "code": code}
        return sum(s.value for s in samples if s.name == "ember_requests_total" and labels.items() <= s.labels.items())

    before_ok, before_bad = counted("200"), counted("400")
    given = triton.InferInput("x", [2, 4], "FP32")
    given.set_data_from_numpy(_rows(2))
    client.infer("arrays.norms", [given], headers=dict(auth))
    assert http.post("/v2/models/arrays.norms/infer", json={"inputs": []}).status_code == 400
    assert (counted("200") - before_ok, counted("400") - before_bad) == (1, 1)


def test_an_untyped_array_takes_any_numeric_datatype(arrays, client, auth):
    for dtype, datatype in [(np.int16, "INT16"), (np.float64, "FP64"), (np.bool_, "BOOL"), (np.float16, "FP16")]:
        given = triton.InferInput("x", [2, 3], datatype)
        given.set_data_from_numpy(np.ones((2, 3), dtype=dtype))
        result = client.infer("arrays.counts", [given], headers=dict(auth))
        assert result.as_numpy("output").tolist() == [6], datatype


def test_errors_reach_tritonclient_with_their_status(arrays, client, auth):
    wrong = triton.InferInput("x", [1, 4], "FP64")
    wrong.set_data_from_numpy(np.ones((1, 4), dtype=np.float64))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("arrays.norms", [wrong], headers=auth)
    assert refused.value.status() == "400"
    assert "FP64" in refused.value.message() and "FP32" in refused.value.message()
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("arrays.nothing", headers=auth)
    assert unknown.value.status() == "404"
    with pytest.raises(InferenceServerException) as anonymous:
        client.get_model_metadata("arrays.scale")
    assert anonymous.value.status() == "401"


def _infer(http: httpx.Client, model: str, body: dict[str, Any], binary: bytes = b"",
           headers: dict[str, str] | None = None) -> httpx.Response:
    head = msgspec.json.encode(body)
    extra = {LENGTH: str(len(head))} if binary else {}
    return http.post(f"/v2/models/{model}/infer", content=head + binary, headers={**extra, **(headers or {})})


def _refused(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str)
    for word in words:
        assert word in message, message


def test_bad_tensors_are_400s(arrays, http):
    norms = "arrays.norms"
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT32",
                                              "data": [1, 2, 3, 4]}]}), 400, "INT32", "FP32")
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                              "data": [1, 2, 3, 4, 5, 6]}]}), 400, "shape", "[-1, 4]")
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [4, 4], "datatype": "FP32",
                                              "data": [1, 2, 3, 4]}]}), 400, "4 elements", "16")
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                              "data": [1, 2, "three", 4]}]}), 400, "numbers")
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BYTES",
                                              "data": ["a", "b", "c", "d"]}]}), 400, "BYTES")
    _refused(_infer(http, norms, {"inputs": [{"name": "y", "shape": [1, 4], "datatype": "FP32",
                                              "data": [1, 2, 3, 4]}]}), 400, "unknown input 'y'")
    _refused(_infer(http, "arrays.scale", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                       "data": [1, 2, 3, 4]}]}), 400, "missing input 'factor'")
    _refused(_infer(http, norms, {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                              "data": [1, 2, 3, 4]}], "outputs": [{"name": "logits"}]}),
             400, "unknown output")
    _refused(http.post(f"/v2/models/{norms}/infer", content=b"{not json"), 400, "malformed")


def test_binary_sizes_must_match_the_body(arrays, http):
    norms = "arrays.norms"
    data = np.ones((1, 4), dtype=np.float32).tobytes()
    huge = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                        "parameters": {"binary_data_size": 10**15}}]}
    _refused(_infer(http, norms, huge, data), 400, "binary_data_size")
    beyond = {"inputs": [{"name": "x", "shape": [1000, 4], "datatype": "FP32",
                          "parameters": {"binary_data_size": 16000}}]}
    _refused(_infer(http, norms, beyond, data), 400, "16000", "more than the 16 bytes")
    short = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": 32}}]}
    _refused(_infer(http, norms, short, data), 400, "more than the 16 bytes")
    extra = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    _refused(_infer(http, norms, extra, data + b"spare"), 400, "5 bytes", "belong to no input")
    head = msgspec.json.encode(extra)
    lying = http.post(f"/v2/models/{norms}/infer", content=head + data, headers={LENGTH: str(10**9)})
    _refused(lying, 400, LENGTH)
    raw = http.post(f"/v2/models/{norms}/infer", content=data, headers={LENGTH: "0"})
    _refused(raw, 400, "raw binary request")
    ok = _infer(http, norms, extra, data)
    assert ok.json()["outputs"][0]["data"] == [2.0], ok.text


def test_the_document_declares_the_protocols_own_errors(arrays, http):
    """The 404s below answer {"error": message}; /openapi.json said ErrorBody (schemathesis' ST108)."""
    paths = http.get("/openapi.json").json()["paths"]
    for method, path in [("get", "/v2/models/{model}"), ("get", "/v2/models/{model}/ready"),
                         ("get", "/v2/models/{model}/config"), ("post", "/v2/models/{model}/infer")]:
        declared = paths[path][method]["responses"]["404"]["content"]["application/json"]["schema"]
        assert declared == {"$ref": "#/components/schemas/OipError"}, (method, path)
        _refused(http.request(method.upper(), path.replace("{model}", "arrays.nothing"), json={"inputs": []}), 404)


def test_unknown_models_versions_and_tokens(arrays, http, anon_http):
    _refused(http.get("/v2/models/arrays.nothing"), 404, "nothing")
    _refused(http.get("/v2/models/nobody.scale"), 404)
    _refused(http.get("/v2/models/arrays"), 404, "<app>.<function>")
    _refused(http.get("/v2/models/arrays.echo"), 404, "not a model")
    _refused(http.get("/v2/models/arrays.scale/stats"), 404, "no route")  # not served: the protocol's 404
    _refused(http.post("/v2/repository/models/arrays.scale/load"), 404, "no route")
    # a newline in the path (schemathesis: POST /v2/%0A%F1%BA%9E%9A): the protocol's 404 too, after the token
    _refused(http.post("/v2/%0A%F1%BA%9E%9A"), 404, "no route")
    _refused(http.get("/v2/models/arrays.scale/%0Astats"), 404, "no route")
    _refused(anon_http.post("/v2/%0A"), 401)
    _refused(http.get(f"/v2/models/arrays.scale/versions/{arrays.version + 7}"), 404, "version")
    for version in ["0", "-1", "1e3", "v1", "9" * 40]:
        _refused(http.get(f"/v2/models/arrays.scale/versions/{version}"), 404, "version")
    _refused(http.post(f"/v2/models/arrays.scale/versions/{arrays.version + 7}/infer", json={"inputs": []}), 404)
    missing = anon_http.post("/v2/models/arrays.norms/infer", json={"inputs": []})
    _refused(missing, 401)
    assert missing.headers["www-authenticate"] == "Bearer"
    _refused(anon_http.get("/v2/models/arrays.scale"), 401)
    _refused(anon_http.get("/v2"), 401)
    _refused(anon_http.get("/v2/models/arrays.scale/stats"), 401)
    assert anon_http.get("/v2/health/live").status_code == 200  # the probes, as /healthz and /readyz


def test_a_token_sees_only_its_apps_models(arrays, http, anon_http):
    token = _token(http, ["arrays"], ["invoke", "read"])
    mine = anon_http.get("/v2/models/arrays.scale", headers=bearer(token))
    assert mine.status_code == 200, mine.text
    for path in ["/v2/models/arrays-other.double", "/v2/models/arrays-other.double/ready",
                 f"/v2/models/arrays-other.double/versions/{arrays.version}"]:
        hidden, unknown = (anon_http.get(path, headers=bearer(token)),
                           anon_http.get(path.replace("arrays-other", "arrays-nobody"), headers=bearer(token)))
        assert hidden.status_code == unknown.status_code == 404, hidden.text
    hidden_infer = anon_http.post("/v2/models/arrays-other.double/infer", headers=bearer(token),
                                  json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                    "data": [1, 2, 3, 4]}]})
    _refused(hidden_infer, 404)
    index = anon_http.post("/v2/repository/index", headers=bearer(token), json={})
    names = {m["name"] for m in index.json()}
    assert "arrays.scale" in names and not any(n.startswith("arrays-other.") for n in names)
    listed = anon_http.get("/v2/models", headers=bearer(token)).json()["models"]
    assert "arrays.norms" in listed and not any(n.startswith("arrays-other.") for n in listed)
    _refused(anon_http.get("/v2/models/arrays-other.double/config", headers=bearer(token)), 404)
    assert "arrays-other.double" in {m["name"] for m in http.post("/v2/repository/index").json()}
    reader = _token(http, ["arrays"], ["read"])
    cannot_infer = anon_http.post("/v2/models/arrays.norms/infer", headers=bearer(reader),
                                  json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                    "data": [1, 2, 3, 4]}]})
    _refused(cannot_infer, 403, "invoke")


def test_an_oversized_body_is_a_413(arrays, http):
    big = b"\x00" * (4 * 1024 * 1024 + 1)
    response = http.post("/v2/models/arrays.norms/infer", content=big, headers={LENGTH: "2"})
    _refused(response, 413, "EMBER_MAX_BODY_BYTES")


@pytest.fixture(scope="module")
def anon_http(platform: EmbeddedPlatform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=platform.url, timeout=60) as c:
        yield c


def test_answers_are_what_the_metadata_declares(arrays, client, auth):
    """A function declared float32 whose mean came out float64 answered FP64 (and any shape): clients that size
    their buffers from the metadata broke. It answers FP32 now; a shape its declaration denies is the model's error."""
    x = triton.InferInput("x", [3, 4], "FP32")
    x.set_data_from_numpy(_rows(3))
    means = client.infer("arrays.means", [x], headers=dict(auth))
    assert means.get_output("output")["datatype"] == "FP32" and means.get_output("output")["shape"] == [3]
    np.testing.assert_allclose(means.as_numpy("output"), _rows(3).mean(axis=1), rtol=1e-6)
    with pytest.raises(InferenceServerException, match="declared"):
        client.infer("arrays.misshapen", [x], headers=dict(auth))
