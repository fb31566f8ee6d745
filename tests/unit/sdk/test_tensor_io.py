"""numpy arrays as a function's parameters and result: the Tensor annotation, the schema the platform validates
with, decoding from JSON, msgpack and compact tensors, encoding results, and the tensor signature (an Open
Inference Protocol model)."""

from __future__ import annotations

from typing import Annotated

import msgspec
import numpy as np
import pytest

import ember
from ember._types import CallIO
from ember.wire import encode_output
from ember.wire.tensors import TensorMeta, compact_of

Rows = Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, 3))]


def scale(x: Rows, factor: Annotated[np.ndarray, ember.Tensor(dtype="int64", shape=(1,))]) -> Rows:
    return x * factor[0]


def anything(x: np.ndarray) -> np.ndarray:
    return x


def mixed(x: np.ndarray, name: str) -> np.ndarray:
    return x


def test_the_tensor_annotation_is_checked_at_once():
    with pytest.raises(ember.InvalidSpecError, match="dtype"):
        ember.Tensor(dtype="complex64")
    with pytest.raises(ember.InvalidSpecError, match="shape"):
        ember.Tensor(shape=(2, "a"))  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match="shape"):
        ember.Tensor(shape=(1,) * 17)
    assert ember.Tensor(shape=(-1, 3)).shape == (None, 3)


def test_arrays_give_a_schema_of_nested_lists_and_a_signature():
    io = CallIO.of(scale, batched=False, is_method=False)
    schema = io.input_schema()["$defs"]["scale_args"]["properties"]
    assert schema["x"] == {"type": "array", "items": {"type": "array", "items": {"type": "number"},
                                                      "minItems": 3, "maxItems": 3}}
    assert schema["factor"] == {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 1}
    signature = io.tensor_signature()
    assert signature is not None
    assert signature.inputs == [TensorMeta(name="x", datatype="FP32", shape=[-1, 3]),
                                TensorMeta(name="factor", datatype="INT64", shape=[1])]
    assert signature.outputs == [TensorMeta(name="output", datatype="FP32", shape=[-1, 3])]
    assert CallIO.of(mixed, batched=False, is_method=False).tensor_signature() is None  # not all arrays


def test_arrays_decode_from_json_msgpack_and_compact_tensors():
    io = CallIO.of(scale, batched=False, is_method=False)
    _, kwargs = io.decode_input(b'{"x": [[1, 2, 3]], "factor": [2]}')
    assert kwargs["x"].dtype == np.float32 and kwargs["x"].tolist() == [[1, 2, 3]]
    _, packed = io.decode_input(msgspec.msgpack.encode({"x": [[1, 2, 3]], "factor": [2]}), "msgpack")
    assert packed["factor"].dtype == np.int64
    compact = msgspec.msgpack.encode({"x": compact_of(np.ones((2, 3), dtype=np.float32)),
                                      "factor": compact_of(np.array([3], dtype=np.int64))})
    _, from_compact = io.decode_input(compact, "msgpack")
    assert from_compact["x"].shape == (2, 3) and from_compact["x"].flags.writeable
    assert scale(**from_compact).tolist() == [[3.0] * 3] * 2


@pytest.mark.parametrize(("body", "field"), [
    (b'{"x": [[1, 2]], "factor": [2]}', "$.x"),
    (b'{"x": [[1, 2, 3], [4]], "factor": [2]}', "$.x"),
    (b'{"x": [["a", "b", "c"]], "factor": [2]}', "$.x"),
    (b'{"x": [[1, 2, 3]], "factor": [2, 3]}', "$.factor"),
])
def test_a_wrong_array_names_its_parameter(body, field):
    io = CallIO.of(scale, batched=False, is_method=False)
    with pytest.raises(ember.InvalidInputError) as refused:
        io.decode_input(body)
    assert refused.value.field == field


def test_a_compact_tensor_of_another_dtype_is_refused():
    io = CallIO.of(scale, batched=False, is_method=False)
    body = msgspec.msgpack.encode({"x": compact_of(np.ones((1, 3), dtype=np.float64)),
                                   "factor": compact_of(np.array([3], dtype=np.int64))})
    with pytest.raises(ember.InvalidInputError, match="FP64"):
        io.decode_input(body, "msgpack")


def test_results_encode_as_lists_or_as_compact_tensors():
    result = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert encode_output(result) == b"[[0.0,1.0],[2.0,3.0]]"
    assert msgspec.msgpack.decode(encode_output(result, "msgpack")) == [[0.0, 1.0], [2.0, 3.0]]
    ext = msgspec.msgpack.decode(encode_output(result, "msgpack", compact=True))
    assert isinstance(ext, msgspec.msgpack.Ext)
    assert encode_output({"n": np.int64(3), "f": np.float32(0.5)}) == b'{"n":3,"f":0.5}'
    with pytest.raises(ember.RemoteError, match="not JSON-able"):
        encode_output(object())


def test_an_untyped_array_takes_any_dtype_and_a_handle_sends_arrays_as_lists():
    io = CallIO.of(anything, batched=False, is_method=False)
    args, _ = io.decode_input(msgspec.msgpack.encode(compact_of(np.array([True, False]))), "msgpack")
    assert args[0].dtype == np.bool_
    assert io.encode_args((np.array([1, 2]),), {}) == b"[1,2]"
    assert io.decode_output(b"[1.5, 2.5]").tolist() == [1.5, 2.5]


def test_a_batched_function_of_arrays():
    def batched(xs: list[Rows]) -> list[np.ndarray]:
        return xs

    io = CallIO.of(batched, batched=True, is_method=False)
    assert io.decode_item(b"[[1, 2, 3]]").dtype == np.float32
    assert io.tensor_signature() is not None


def test_bytes_functions_say_so():
    def echo(data: bytes) -> bytes:
        return data

    io = CallIO.of(echo, batched=False, is_method=False)
    assert io.takes_bytes and io.returns_bytes
    assert not CallIO.of(mixed, batched=False, is_method=False).takes_bytes
    assert io.decode_input(msgspec.msgpack.encode(b"\x00\x01"), "msgpack") == ((b"\x00\x01",), {})


def test_max_body_bytes_is_checked_at_once():
    app = ember.App("limits")
    for bad in (0, -1, True, 1.5, 2 * 1024**3):
        with pytest.raises(ember.InvalidSpecError, match="max_body_bytes"):
            app.function(max_body_bytes=bad)
    with pytest.raises(ember.InvalidSpecError, match="max_body_bytes"):
        ember.method(max_body_bytes=0)

    @app.function(max_body_bytes=16 * 1024 * 1024)
    def take(data: bytes) -> int:
        return len(data)

    assert app.services["take"].functions[0].max_body_bytes == 16 * 1024 * 1024
