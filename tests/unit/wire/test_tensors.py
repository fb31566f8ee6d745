"""Tensors on the wire without numpy: packing and unpacking every datatype, and the compact form's checks."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from ember import RemoteError
from ember.wire.tensors import DATATYPES, compact_ext, compact_of, pack, read_compact, unpack


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_pack_matches_numpy_little_endian_and_unpacks_back(datatype):
    numpy_name = DATATYPES[datatype][0]
    values = [True, False, True] if datatype == "BOOL" else [0, 1, 7] if "INT" in datatype else [0.5, -1.25, 3.0]
    if datatype.startswith("UINT") or datatype == "BOOL":
        values = [abs(v) if not isinstance(v, bool) else v for v in values]
    packed = pack(datatype, values)
    assert packed == np.asarray(values, dtype=np.dtype(numpy_name).newbyteorder("<")).tobytes()
    assert unpack(datatype, packed) == values


@pytest.mark.parametrize(("datatype", "values"), [
    ("INT32", [1.5]), ("INT8", [300]), ("UINT8", [-1]), ("FP32", ["1"]), ("BOOL", [1]), ("INT64", [True]),
    ("FP32", [[1.0]]),
])
def test_pack_refuses_elements_that_are_not_of_the_datatype(datatype, values):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        pack(datatype, values)


def test_a_compact_tensor_round_trips_through_msgpack():
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    ext = compact_of(array)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode({"x": ext}))["x"]
    tensor = read_compact(decoded.data)
    assert (tensor.datatype, tensor.shape) == ("INT16", [2, 3])
    assert np.frombuffer(tensor.data, dtype="<i2").reshape(2, 3).tolist() == array.tolist()


@pytest.mark.parametrize(("datatype", "shape", "data", "problem"), [
    ("FP32", [2, 2], b"\x00" * 12, "has 16 bytes, not 12"),
    ("FP32", [2, 2], b"\x00" * 20, "has 16 bytes, not 20"),
    ("BYTES", [1], b"x", "unknown tensor datatype"),
    ("FP32", [-1], b"", "whole numbers >= 0"),
    ("FP32", [1] * 17, b"\x00" * 4, "at most 16"),
])
def test_a_malformed_compact_tensor_is_refused(datatype, shape, data, problem):
    ext = compact_ext(datatype, shape, data)
    with pytest.raises(ValueError, match=problem):
        read_compact(ext.data)
    with pytest.raises(ValueError, match="malformed"):
        read_compact(b"\x93\x01")


def test_an_output_of_no_protocol_datatype_is_the_users_error():
    with pytest.raises(RemoteError, match="datatype"):
        compact_of(np.array(["a"]))
