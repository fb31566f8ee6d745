"""The Open Inference Protocol over gRPC against the real platform, with Triton's own ``tritonclient.grpc`` as a user
calls it (``authorization`` metadata included): health, metadata, the repository index, inference with raw binary
tensors and with typed contents, a decoupled model (a generator) streamed through ``start_stream``; and the attacks:
wrong datatype, wrong shape, raw contents of the wrong size, unknown models, no token, a bad token, a model of an
app the token may not see, a request over the body limit and one over the largest message the server takes.

The session's platform serves gRPC on a port of its own (``grpc_port=0``); the apps: tests/apps/arrays.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from support.auth import bearer
from support.paths import REPO
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from ember.dev.embedded import EmbeddedPlatform

pytestmark = pytest.mark.integration

ARRAYS = REPO / "tests" / "apps" / "arrays" / "arrays.py"


@pytest.fixture(scope="module")
def arrays(deployed):
    deployed(ARRAYS, "arrays-other")
    return deployed(ARRAYS, "arrays")


@pytest.fixture(scope="module")
def client(platform: EmbeddedPlatform) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url=platform.grpc_address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(platform: EmbeddedPlatform) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The service's stub, for messages tritonclient does not write (typed contents, raw contents that lie)."""
    with grpc.insecure_channel(platform.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def auth(platform: EmbeddedPlatform) -> dict[str, str]:
    return {"authorization": f"Bearer {platform.token}"}


def _token(http: httpx.Client, apps: list[str], scopes: list[str]) -> str:
    response = http.post("/v1/tokens", json={"scopes": scopes, "apps": apps, "name": f"grpc-{uuid.uuid4().hex[:6]}"})
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def _rows(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4)


def _input(name: str, value: np.ndarray, datatype: str = "FP32") -> triton.InferInput:
    given = triton.InferInput(name, list(value.shape), datatype)
    given.set_data_from_numpy(value)
    return given


def _refused(call: Any, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(InferenceServerException) as refused:
        call()
    assert refused.value.status() == str(code), refused.value
    message = refused.value.message()
    for word in words:
        assert word in message, message
    return str(message)


def test_health_metadata_and_the_repository_index(arrays, client, auth):
    assert client.is_server_live() and client.is_server_ready()  # the probes need no token, as over HTTP
    server = client.get_server_metadata(headers=auth, as_json=True)
    assert server["name"] == "ember" and "model_repository" in server["extensions"]
    assert client.is_model_ready("arrays.scale", headers=auth)
    assert client.is_model_ready("arrays.scale", model_version=str(arrays.version), headers=auth)
    meta = client.get_model_metadata("arrays.scale", headers=auth, as_json=True)
    assert meta == {"name": "arrays.scale", "versions": [str(arrays.version)], "platform": "ember",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]},
                               {"name": "factor", "datatype": "FP32", "shape": ["1"]}],
                    "outputs": [{"name": "output", "datatype": "FP32", "shape": ["-1", "4"]}]}
    index = {m["name"]: m for m in client.get_model_repository_index(headers=auth, as_json=True)["models"]}
    assert index["arrays.running_sums"] == {"name": "arrays.running_sums", "version": str(arrays.version),
                                            "state": "READY"}
    assert "arrays.echo" not in index and "arrays-other.double" in index
    _refused(lambda: client.get_model_config("arrays.scale", headers=auth), grpc.StatusCode.UNIMPLEMENTED)


def test_tritonclient_infers_with_raw_tensors(arrays, client, auth):
    x = _rows(3)
    inputs = [_input("x", x), _input("factor", np.array([0.5], dtype=np.float32))]
    result = client.infer("arrays.scale", inputs, request_id="r-1", headers=auth,
                          outputs=[triton.InferRequestedOutput("output")])
    np.testing.assert_array_equal(result.as_numpy("output"), x * 0.5)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("r-1", "arrays.scale", str(arrays.version))
    norms = client.infer("arrays.norms", [_input("x", _rows(2))], model_version=str(arrays.version), headers=auth)
    np.testing.assert_allclose(norms.as_numpy("output"), np.linalg.norm(_rows(2), axis=1), rtol=1e-6)
    for dtype, datatype in [(np.int16, "INT16"), (np.bool_, "BOOL"), (np.float16, "FP16")]:
        counted = client.infer("arrays.counts", [_input("x", np.ones((2, 3), dtype=dtype), datatype)], headers=auth)
        assert counted.as_numpy("output").tolist() == [6], datatype


def test_typed_contents_are_inputs_too(arrays, stub, auth):
    request = pb.ModelInferRequest(model_name="arrays.norms", id="typed", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[2, 4], contents=pb.InferTensorContents(fp32_contents=_rows(2).ravel())),
    ])
    response = stub.ModelInfer(request, metadata=list(auth.items()))
    assert (response.id, response.outputs[0].datatype, list(response.outputs[0].shape)) == ("typed", "FP32", [2])
    out = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    np.testing.assert_allclose(out, np.linalg.norm(_rows(2), axis=1), rtol=1e-6)


def _stub_refused(stub: pb_grpc.GRPCInferenceServiceStub, auth: dict[str, str], request: pb.ModelInferRequest,
                  code: grpc.StatusCode, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, metadata=list(auth.items()))
    assert refused.value.code() == code, refused.value
    for word in words:
        assert word in refused.value.details(), refused.value.details()


def test_bad_tensors_are_invalid_arguments_naming_the_field(arrays, client, stub, auth):
    _refused(lambda: client.infer("arrays.norms", [_input("x", np.ones((1, 4)), "FP64")], headers=auth),
             grpc.StatusCode.INVALID_ARGUMENT, "FP64", "FP32", "inputs[0].datatype")
    _refused(lambda: client.infer("arrays.norms", [_input("x", np.ones((2, 3), dtype=np.float32))], headers=auth),
             grpc.StatusCode.INVALID_ARGUMENT, "[-1, 4]", "inputs[0].shape")
    _refused(lambda: client.infer("arrays.scale", [_input("x", _rows(1))], headers=auth),
             grpc.StatusCode.INVALID_ARGUMENT, "missing input 'factor'")
    _refused(lambda: client.infer("arrays.norms", [_input("x", _rows(1))], headers=auth,
                                  outputs=[triton.InferRequestedOutput("logits")]),
             grpc.StatusCode.INVALID_ARGUMENT, "unknown output")
    tensor = pb.ModelInferRequest.InferInputTensor
    short = pb.ModelInferRequest(model_name="arrays.norms", inputs=[tensor(name="x", datatype="FP32", shape=[1, 4])],
                                 raw_input_contents=[b"\x00" * 12])
    _stub_refused(stub, auth, short, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents[0]", "12 bytes", "16")
    huge = pb.ModelInferRequest(model_name="arrays.norms", inputs=[tensor(name="x", datatype="FP32",
                                                                          shape=[2**40, 4])],
                                raw_input_contents=[b"\x00" * 16])
    _stub_refused(stub, auth, huge, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents[0]")
    misplaced = pb.ModelInferRequest(model_name="arrays.norms", inputs=[tensor(
        name="x", datatype="FP32", shape=[1, 4], contents=pb.InferTensorContents(int_contents=[1, 2, 3, 4]))])
    _stub_refused(stub, auth, misplaced, grpc.StatusCode.INVALID_ARGUMENT, "fp32_contents", "inputs[0].contents")
    bytes_in = pb.ModelInferRequest(model_name="arrays.counts", inputs=[tensor(
        name="x", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"a"]))])
    _stub_refused(stub, auth, bytes_in, grpc.StatusCode.INVALID_ARGUMENT, "BYTES", "not supported")
    fewer = pb.ModelInferRequest(model_name="arrays.scale", inputs=[tensor(name="x", datatype="FP32", shape=[1, 4]),
                                                                    tensor(name="factor", datatype="FP32", shape=[1])],
                                 raw_input_contents=[b"\x00" * 16])
    _stub_refused(stub, auth, fewer, grpc.StatusCode.INVALID_ARGUMENT, "one per input")


def test_unknown_models_and_tokens(arrays, client, http, platform, auth):
    _refused(lambda: client.infer("arrays.nothing", [_input("x", _rows(1))], headers=auth),
             grpc.StatusCode.NOT_FOUND, "nothing")
    _refused(lambda: client.get_model_metadata("arrays", headers=auth), grpc.StatusCode.NOT_FOUND, "<app>.<function>")
    _refused(lambda: client.get_model_metadata("arrays.echo", headers=auth), grpc.StatusCode.NOT_FOUND, "not a model")
    _refused(lambda: client.is_model_ready("arrays.scale", model_version="0", headers=auth),
             grpc.StatusCode.NOT_FOUND, "version")
    _refused(lambda: client.infer("arrays.norms", [_input("x", _rows(1))]), grpc.StatusCode.UNAUTHENTICATED,
             "missing Authorization")
    _refused(lambda: client.get_model_metadata("arrays.scale", headers={"authorization": "Bearer nonsense"}),
             grpc.StatusCode.UNAUTHENTICATED, "malformed")
    _refused(lambda: client.get_server_metadata(), grpc.StatusCode.UNAUTHENTICATED)
    mine = {"authorization": f"Bearer {_token(http, ['arrays'], ['invoke', 'read'])}"}
    assert client.infer("arrays.norms", [_input("x", _rows(1))], headers=mine).as_numpy("output").shape == (1,)
    hidden = _refused(lambda: client.infer("arrays-other.double", [_input("x", _rows(1))], headers=mine),
                      grpc.StatusCode.NOT_FOUND)
    unknown = _refused(lambda: client.infer("arrays-nobody.double", [_input("x", _rows(1))], headers=mine),
                       grpc.StatusCode.NOT_FOUND)
    assert hidden.replace("arrays-other", "arrays-nobody") == unknown  # nothing tells the two apart
    _refused(lambda: client.is_model_ready("arrays-other.double", headers=mine), grpc.StatusCode.NOT_FOUND)
    index = client.get_model_repository_index(headers=mine, as_json=True)["models"]
    assert not any(m["name"].startswith("arrays-other.") for m in index)
    reader = {"authorization": f"Bearer {_token(http, ['arrays'], ['read'])}"}
    _refused(lambda: client.infer("arrays.norms", [_input("x", _rows(1))], headers=reader),
             grpc.StatusCode.PERMISSION_DENIED, "invoke")


def test_oversized_requests_are_resource_exhausted(arrays, client, auth):
    over_limit = np.zeros((4 * 1024 * 1024 // 16 + 1, 4), dtype=np.float32)  # just over EMBER_MAX_BODY_BYTES
    _refused(lambda: client.infer("arrays.norms", [_input("x", over_limit)], headers=auth),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "EMBER_MAX_BODY_BYTES")
    beyond_any = np.zeros((9 * 1024 * 1024 // 16, 4), dtype=np.float32)  # over what any function takes (8 MB NATS)
    _refused(lambda: client.infer("arrays.norms", [_input("x", beyond_any)], headers=auth),
             grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert client.is_server_live()  # the server took it in its stride


def _collect(client: triton.InferenceServerClient, auth: dict[str, str],
             requests: list[tuple[str, list[triton.InferInput]]]) -> list[tuple[Any, Any]]:
    """Send ``requests`` on one stream; every callback until each request's final response (or error)."""
    seen: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: seen.put((result, error)), headers=auth)
    try:
        for i, (model, inputs) in enumerate(requests):
            client.async_stream_infer(model, inputs, request_id=f"s-{i}", enable_empty_final_response=True)
        got: list[tuple[Any, Any]] = []
        finished = 0
        while finished < len(requests):
            result, error = seen.get(timeout=60)
            got.append((result, error))
            final = result is not None and result.get_response().parameters["triton_final_response"].bool_param
            finished += bool(error is not None or final)
        return got
    finally:
        client.stop_stream()


def test_a_generator_streams_one_response_per_item(arrays, client, auth):
    x = _rows(3)
    got = _collect(client, auth, [("arrays.running_sums", [_input("x", x)]),
                                  ("arrays.nothing", [_input("x", x)]),
                                  ("arrays.norms", [_input("x", x)])])
    items = [r for r, e in got[:4]]
    assert [e for _, e in got[:4]] == [None] * 4
    assert [r.get_response().parameters["triton_final_response"].bool_param for r in items] == [False] * 3 + [True]
    assert [r.get_response().id for r in items] == ["s-0"] * 4
    for i, result in enumerate(items[:3]):
        np.testing.assert_array_equal(result.as_numpy("output"), x[:i + 1].sum(axis=0))
    assert items[3].get_response().outputs == []  # the empty final response
    (_, error), (norms, no_error) = got[4:]
    assert error is not None and "nothing" in error.message() and no_error is None  # an error ends its request only
    np.testing.assert_allclose(norms.as_numpy("output"), np.linalg.norm(x, axis=1), rtol=1e-6)
    assert norms.get_response().parameters["triton_final_response"].bool_param


def test_a_generator_is_refused_outside_a_stream(arrays, client, auth, http):
    _refused(lambda: client.infer("arrays.running_sums", [_input("x", _rows(1))], headers=auth),
             grpc.StatusCode.UNIMPLEMENTED, "decoupled", "ModelStreamInfer")
    refused = http.post("/v2/models/arrays.running_sums/infer",
                        json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    assert refused.status_code == 501 and "decoupled" in refused.json()["error"], refused.text


def test_a_stream_without_a_token_ends_unauthenticated(arrays, client):
    seen: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: seen.put((result, error)))
    try:
        client.async_stream_infer("arrays.norms", [_input("x", _rows(1))])
        result, error = seen.get(timeout=60)
    finally:
        client.stop_stream()
    assert result is None and error.status() == str(grpc.StatusCode.UNAUTHENTICATED), error


def test_http_and_grpc_answer_alike(arrays, client, auth, platform):
    x = _rows(2)
    over_http = httpx.post(f"{platform.url}/v2/models/arrays.norms/infer", headers=bearer(platform.token),
                           json={"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                             "data": x.ravel().tolist()}]}).json()
    over_grpc = client.infer("arrays.norms", [_input("x", x)], headers=auth)
    assert over_grpc.as_numpy("output").tolist() == over_http["outputs"][0]["data"]


def test_a_token_revoked_while_its_stream_is_open_is_refused_at_the_next_request(arrays, client, http):
    """Each request of a stream is checked as a unary call is: the token was looked up once per stream, and a revoked
    (or expired) one went on inferring on a stream it had opened."""
    token = _token(http, ["arrays"], ["invoke", "read"])
    seen: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: seen.put((result, error)),
                        headers={"authorization": f"Bearer {token}"})
    try:
        client.async_stream_infer("arrays.norms", [_input("x", _rows(1))])
        result, error = seen.get(timeout=60)
        assert error is None and result.as_numpy("output") is not None, error
        assert http.delete(f"/v1/tokens/{token.split('_')[1]}").status_code == 200
        client.async_stream_infer("arrays.norms", [_input("x", _rows(1))])
        result, error = seen.get(timeout=60)
    finally:
        client.stop_stream()
    assert result is None and error.status() == str(grpc.StatusCode.UNAUTHENTICATED), error


def test_a_streamed_requests_error_names_its_request(arrays, stub, auth):
    """As Triton answers: the error of one request on a stream carries that request's id and model, so that a client
    sending several on one stream knows which one failed."""
    request = pb.ModelInferRequest(model_name="arrays.nothing", id="which-one", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 3],
                                              contents=pb.InferTensorContents(fp32_contents=[1, 2, 3]))])
    answers = list(stub.ModelStreamInfer(iter([request]), metadata=list(auth.items()), timeout=60))
    assert len(answers) == 1 and "nothing" in answers[0].error_message
    assert (answers[0].infer_response.id, answers[0].infer_response.model_name) == ("which-one", "arrays.nothing")
