"""The Open Inference Protocol's inference requests, checked before anything reaches a replica: the JSON header
and the binary section, every input against the model's tensors, the requested outputs."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from ember._errors import BadRequestError, NotFoundError
from ember.wire import FunctionSpec
from ember.wire.tensors import CompactTensor, TensorMeta, TensorSignature
from ember_platform.gateway.oip import HEADER_LENGTH, _split
from ember_platform.gateway.oip_infer import BodyTail, inputs, timeout_of, version_of, wants_binary

SCALE = FunctionSpec(name="scale", attr="scale", input_mode="kwargs", params=["x", "k"], tensors=TensorSignature(
    inputs=[TensorMeta(name="x", datatype="FP32", shape=[-1, 2]), TensorMeta(name="k", datatype="INT64", shape=[1])],
    outputs=[TensorMeta(name="output", datatype="FP32", shape=[-1, 2])]))
ANY = FunctionSpec(name="any", attr="any", input_mode="single", params=["x"], tensors=TensorSignature(
    inputs=[TensorMeta(name="x")], outputs=[TensorMeta(name="output")]))


def _parse(fn: FunctionSpec, head: dict[str, Any], binary: bytes = b"") -> dict[str, CompactTensor]:
    data = msgspec.json.encode(head)
    req, tail = _split(data + binary, str(len(data)) if binary else None)
    return inputs(req, fn, BodyTail(tail, HEADER_LENGTH))


def test_json_and_binary_inputs_become_the_same_compact_tensors() -> None:
    x = np.array([[1.5, 2], [3, 4]], dtype="<f4")
    as_json = _parse(SCALE, {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1.5, 2], [3, 4]]},
                                        {"name": "k", "shape": [1], "datatype": "INT64", "data": [3]}]})
    as_binary = _parse(SCALE, {"inputs": [
        {"name": "k", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 8}},
        {"name": "x", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]},
        np.array([3], dtype="<i8").tobytes() + x.tobytes())
    assert as_json == as_binary
    assert as_json["x"].data == x.tobytes() and as_json["x"].shape == [2, 2]


def test_an_untyped_input_takes_any_datatype_and_rank() -> None:
    parsed = _parse(ANY, {"inputs": [{"name": "x", "shape": [2, 1, 2], "datatype": "UINT8", "data": [1, 2, 3, 4]}]})
    assert (parsed["x"].datatype, parsed["x"].data) == ("UINT8", b"\x01\x02\x03\x04")


X = {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
K = {"name": "k", "shape": [1], "datatype": "INT64", "data": [1]}


@pytest.mark.parametrize(("inputs", "field", "words"), [
    ([{**X, "datatype": "FP64"}, K], "inputs[0].datatype", "FP64"),
    ([{**X, "datatype": "BYTES"}, K], "inputs[0].datatype", "not supported"),
    ([{**X, "shape": [2, 1]}, K], "inputs[0].shape", "[-1, 2]"),
    ([{**X, "shape": [1, 2, 1]}, K], "inputs[0].shape", "[-1, 2]"),
    ([{**X, "shape": [-1, 2]}, K], "inputs[0].shape", ">= 0"),
    ([{**X, "shape": [2, 2]}, K], "inputs[0].data", "needs 4"),
    ([{**X, "data": [1, 2, 3]}, K], "inputs[0].data", "needs 2"),
    ([{**X, "data": [[1], 2]}, K], "inputs[0].data", "mixes"),
    ([{**X, "data": [1, "2"]}, K], "inputs[0].data", "numbers"),
    ([{**K, "data": [2**70]}, X], "inputs[0].data", ""),
    ([{**K, "data": [1.5]}, X], "inputs[0].data", "whole"),
    ([X, {**X, "name": "y"}], "inputs[1].name", "unknown input"),
    ([X, X], "inputs[1].name", "twice"),
    ([X], "inputs", "missing input 'k'"),
    ([{**X, "data": None}, K], "inputs[0].data", "neither"),
    ([{**X, "shape": [10**9, 2]}, K], "inputs[0].shape", "elements"),
    ([{**X, "shape": [2**64, 0], "data": []}, K], "inputs[0].shape", "below 2**63"),  # no elements: a 500 before
])
def test_bad_inputs_are_400s_naming_the_field(inputs: list[dict[str, Any]], field: str, words: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        _parse(SCALE, {"inputs": inputs})
    assert refused.value.field == field
    assert words in str(refused.value)


@pytest.mark.parametrize(("size", "binary", "words"), [
    (10**15, b"\x00" * 8, "has 8 bytes"),
    (True, b"\x00" * 8, "whole number"),
    (8, b"\x00" * 4, "more than the 4 bytes"),
    (8, b"\x00" * 12, "belong to no input"),
])
def test_binary_sizes_must_fit_the_body(size: Any, binary: bytes, words: str) -> None:
    head = {"inputs": [{"name": "k", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": size}}, X]}
    with pytest.raises(BadRequestError, match=words):
        _parse(SCALE, head, binary)


@pytest.mark.parametrize(("declared", "words"), [("0", "raw binary"), ("99", "more than"), ("x", "whole number"),
                                                 ("3", "malformed"), ("\xb2", "whole number"), ("-1", "whole number"),
                                                 ("9" * 13, "whole number")])
def test_the_header_length_must_be_honest(declared: str, words: str) -> None:
    with pytest.raises(BadRequestError, match=words):
        _split(b'{"inputs": []}', declared)


def test_requested_outputs_and_timeouts() -> None:
    req, _ = _split(msgspec.json.encode({"inputs": [], "parameters": {"binary_data_output": True, "timeout": 5000}}),
                    None)
    assert wants_binary(req, SCALE) is True
    assert timeout_of(req, 60.0) == 0.005
    req, _ = _split(b'{"inputs": [], "outputs": [{"name": "output", "parameters": {"binary_data": false}}]}', None)
    assert wants_binary(req, SCALE) is False
    req, _ = _split(b'{"inputs": [], "outputs": [{"name": "logits"}]}', None)
    with pytest.raises(BadRequestError, match="unknown output"):
        wants_binary(req, SCALE)
    req, _ = _split(b'{"inputs": [], "parameters": {"timeout": 1' + b"0" * 400 + b'}}', None)
    assert timeout_of(req, 60.0) == 60.0  # past any limit (a float overflow, a 500, before)
    req, _ = _split(b'{"inputs": [], "parameters": {"timeout": -1}}', None)
    with pytest.raises(BadRequestError, match="microseconds"):
        timeout_of(req, 60.0)


@pytest.mark.parametrize("raw", ["0", "-1", "\u00b2", "\u0661", "1e3", "9" * 13, ""])
def test_a_version_that_is_no_whole_number_is_a_404(raw: str) -> None:
    with pytest.raises(NotFoundError, match="version"):
        version_of(raw)
    assert version_of("12") == 12
