"""gRPC's inference requests read as HTTP's are (the same checks then apply), a decoupled model's JSON in and out, and
Ember's errors as Triton's status codes. The messages are tritonclient's own: the control plane's generated ones
carry the same names in protobuf's default pool, and one process cannot hold both."""

from __future__ import annotations

import math

import grpc
import msgspec
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from ember._errors import (
    BadRequestError,
    DeadlineExceededError,
    EmberError,
    ForbiddenError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RemoteError,
    UnavailableError,
)
from ember.wire import FunctionSpec
from ember.wire.tensors import TensorMeta, TensorSignature
from ember_platform.auth.tokens import TokenRefused
from ember_platform.gateway.oip_grpc_requests import infer_request, status_of
from ember_platform.gateway.oip_infer import Unsupported, inputs
from ember_platform.gateway.oip_stream import item_tensor, nested, stream_body

SCALE = FunctionSpec(name="scale", attr="scale", input_mode="kwargs", params=["x", "k"], tensors=TensorSignature(
    inputs=[TensorMeta(name="x", datatype="FP32", shape=[-1, 2]), TensorMeta(name="k", datatype="INT64", shape=[1])],
    outputs=[TensorMeta(name="output", datatype="FP32", shape=[-1, 2])]))
Tensor = pb.ModelInferRequest.InferInputTensor


@pytest.mark.parametrize(("error", "code"), [
    (BadRequestError("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (TokenRefused("x", given=False), grpc.StatusCode.UNAUTHENTICATED),
    (ForbiddenError("x"), grpc.StatusCode.PERMISSION_DENIED),
    (NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
    (PayloadTooLargeError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (OverloadedError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnavailableError("x"), grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceededError("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (RemoteError("x"), grpc.StatusCode.INTERNAL),
    (Unsupported("x"), grpc.StatusCode.UNIMPLEMENTED),
    (EmberError("x"), grpc.StatusCode.INTERNAL),
])
def test_errors_get_tritons_status_codes(error: EmberError, code: grpc.StatusCode) -> None:
    assert status_of(error) == code


def test_typed_and_raw_contents_become_the_same_tensors() -> None:
    x = np.array([[1.5, 2], [3, 4]], dtype="<f4")
    typed = pb.ModelInferRequest(id="r", inputs=[
        Tensor(name="x", datatype="FP32", shape=[2, 2], contents=pb.InferTensorContents(fp32_contents=x.ravel())),
        Tensor(name="k", datatype="INT64", shape=[1], contents=pb.InferTensorContents(int64_contents=[3]))],
        parameters={"timeout": pb.InferParameter(int64_param=5000), "flag": pb.InferParameter(bool_param=True)})
    raw = pb.ModelInferRequest(inputs=[Tensor(name="k", datatype="INT64", shape=[1]),
                                       Tensor(name="x", datatype="FP32", shape=[2, 2])],
                               raw_input_contents=[np.array([3], dtype="<i8").tobytes(), x.tobytes()])
    typed_req, typed_raw = infer_request(typed)
    assert (typed_req.id, typed_req.parameters) == ("r", {"timeout": 5000, "flag": True})
    assert inputs(typed_req, SCALE, typed_raw) == inputs(*infer_request(raw)[:1], SCALE, infer_request(raw)[1])


@pytest.mark.parametrize(("request_", "field", "words"), [
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 2],
                                         contents=pb.InferTensorContents(int_contents=[1, 2]))]),
     "inputs[0].contents", "fp32_contents"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP16", shape=[1, 2],
                                         contents=pb.InferTensorContents(fp32_contents=[1, 2]))]),
     "inputs[0].contents", "raw_input_contents"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 2],
                                         contents=pb.InferTensorContents(fp32_contents=[1, 2]))],
                          raw_input_contents=[b"\x00" * 8]), "inputs[0].contents", "one or the other"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 2]),
                                  Tensor(name="k", datatype="INT64", shape=[1])],
                          raw_input_contents=[b"\x00" * 8]), "raw_input_contents", "one per input"),
])
def test_misplaced_contents_are_refused_naming_the_field(request_: pb.ModelInferRequest, field: str,
                                                         words: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        infer_request(request_)
    assert refused.value.field == field and words in str(refused.value)


@pytest.mark.parametrize(("request_", "field", "words"), [
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 2]),
                                  Tensor(name="k", datatype="INT64", shape=[1])],
                          raw_input_contents=[b"\x00" * 8, b"\x00" * 4]), "raw_input_contents[1]", "4 bytes"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 2]),
                                  Tensor(name="k", datatype="INT64", shape=[1])]), "inputs[0].contents", "neither"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[2, 2],
                                         contents=pb.InferTensorContents(fp32_contents=[1, 2]))]),
     "inputs[0].contents", "needs 4"),
])
def test_the_checks_name_grpcs_fields(request_: pb.ModelInferRequest, field: str, words: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        inputs(*infer_request(request_)[:1], SCALE, infer_request(request_)[1])
    assert refused.value.field == field and words in str(refused.value)


def test_a_decoupled_models_json_in_and_out() -> None:
    assert nested([1, 2, 3, 4, 5, 6], [2, 3]) == [[1, 2, 3], [4, 5, 6]]
    assert nested([], [2, 0]) == [[], []] and nested([7], []) == 7
    req, raw = infer_request(pb.ModelInferRequest(inputs=[
        Tensor(name="x", datatype="FP32", shape=[1, 2], contents=pb.InferTensorContents(fp32_contents=[1.5, 2])),
        Tensor(name="k", datatype="INT64", shape=[1], contents=pb.InferTensorContents(int64_contents=[3]))]))
    assert msgspec.json.decode(stream_body(inputs(req, SCALE, raw), SCALE)) == {"x": [[1.5, 2.0]], "k": [3]}
    item = item_tensor(b"[[1.5, 2], [3, 4]]", TensorMeta(name="output", datatype="FP32"))
    assert (item.datatype, item.shape, item.data) == ("FP32", [2, 2], np.array([1.5, 2, 3, 4], "<f4").tobytes())
    assert item_tensor(b"[1, 2]", TensorMeta(name="output")).datatype == "INT64"
    assert item_tensor(b"[true]", TensorMeta(name="output")).datatype == "BOOL"
    for bad in (b"[[1], [2, 3]]", b'["a"]', b"{}"):
        with pytest.raises(RemoteError, match="not a tensor"):
            item_tensor(bad, TensorMeta(name="output", datatype="FP32"))


def test_a_shape_of_many_huge_sizes_is_refused_without_its_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """30,000 sizes of 2**62 (a 270 KB message): their product took 5.8 s of the control plane's event loop before
    the rank was checked; now the rank's check refuses it, and no product of the sizes is taken before."""
    def product(*args: object) -> None:
        raise AssertionError("the sizes' product, before their rank was checked")

    with monkeypatch.context() as patched:
        patched.setattr(math, "prod", product)
        req, raw = infer_request(pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32",
                                                                     shape=[2**62] * 30_000)]))
    with pytest.raises(BadRequestError) as refused:
        inputs(req, SCALE, raw)
    assert refused.value.field == "inputs[0].shape"


def test_a_tensor_without_elements_is_its_lists_to_its_first_empty_size_and_no_more() -> None:
    """``[2**62, 0]`` has no elements; its 2**62 empty lists were built in the event loop."""
    assert nested([], [3, 0, 4]) == [[], [], []] and nested([], [0, 5]) == [] and nested([], [2, 2, 0]) == [[[], []],
                                                                                                          [[], []]]
    with pytest.raises(BadRequestError, match="empty lists"):
        nested([], [2**62, 0])


def test_a_decoupled_models_input_holding_nan_or_infinity_is_refused() -> None:
    """JSON has neither: msgspec wrote null, which reached the generator as NaN (an infinity lost) or was refused."""
    for bad in (math.inf, -math.inf, math.nan):
        req, raw = infer_request(pb.ModelInferRequest(inputs=[
            Tensor(name="x", datatype="FP32", shape=[1, 2], contents=pb.InferTensorContents(fp32_contents=[1, bad])),
            Tensor(name="k", datatype="INT64", shape=[1], contents=pb.InferTensorContents(int64_contents=[3]))]))
        with pytest.raises(BadRequestError, match="NaN or infinity") as refused:
            stream_body(inputs(req, SCALE, raw), SCALE)
        assert refused.value.field == "x"
