"""Tensors on the wire: the Open Inference Protocol's datatypes, a function's tensor signature (what ``/v2`` metadata
shows), and the compact form an array takes inside a msgpack frame.

Nothing here imports numpy: the control plane packs and reads tensors' bytes with ``array`` and ``struct``. The
compact form is a msgpack extension (``TENSOR_EXT``) whose payload is a msgpack ``CompactTensor``: the datatype,
the shape and the elements' bytes, little-endian and row-major, as the binary tensor extension of the protocol
sends them.
"""

from __future__ import annotations

import array
import math
import struct
import sys
from typing import Any

import msgspec

from ember._errors import RemoteError

TENSOR_EXT = 1  # the msgpack extension code of a compact tensor
MAX_TENSOR_RANK = 16  # dimensions of one tensor, at most

# OIP datatype -> (numpy dtype name, bytes per element, ``array``/``struct`` format)
DATATYPES: dict[str, tuple[str, int, str]] = {
    "BOOL": ("bool", 1, "?"),
    "UINT8": ("uint8", 1, "B"),
    "UINT16": ("uint16", 2, "H"),
    "UINT32": ("uint32", 4, "I"),
    "UINT64": ("uint64", 8, "Q"),
    "INT8": ("int8", 1, "b"),
    "INT16": ("int16", 2, "h"),
    "INT32": ("int32", 4, "i"),
    "INT64": ("int64", 8, "q"),
    "FP16": ("float16", 2, "e"),
    "FP32": ("float32", 4, "f"),
    "FP64": ("float64", 8, "d"),
}
DATATYPE_OF_DTYPE = {numpy_name: datatype for datatype, (numpy_name, _, _) in DATATYPES.items()}


class TensorMeta(msgspec.Struct, frozen=True, kw_only=True):
    """One input or output tensor of a function: its name, OIP datatype ("" when any numeric one is taken) and
    shape (-1 for a dimension of any size; ``None``: any rank)."""

    name: str
    datatype: str = ""
    shape: list[int] | None = None


class TensorSignature(msgspec.Struct, frozen=True, kw_only=True):
    """The tensors of a function whose parameters and result are arrays: inputs by parameter name, in order, and
    its one output (named ``output``). Such a function is also a model of the Open Inference Protocol."""

    inputs: list[TensorMeta]
    outputs: list[TensorMeta]


class CompactTensor(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """An array in a msgpack frame (the payload of a ``TENSOR_EXT`` extension)."""

    datatype: str
    shape: list[int]
    data: bytes


_compact_decoder = msgspec.msgpack.Decoder(CompactTensor)


def compact_ext(datatype: str, shape: list[int], data: bytes) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(TENSOR_EXT, msgspec.msgpack.encode(CompactTensor(datatype=datatype, shape=shape,
                                                                                data=data)))


def read_compact(data: Any) -> CompactTensor:
    """A compact tensor's payload (bytes, or any buffer), checked: a known datatype, a shape of whole numbers,
    exactly its bytes. ``ValueError`` saying what is wrong otherwise."""
    try:
        tensor = _compact_decoder.decode(data)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"a malformed tensor: {exc}") from exc
    if tensor.datatype not in DATATYPES:
        raise ValueError(f"unknown tensor datatype {tensor.datatype!r}")
    check_shape(tensor.shape)
    expected = elements(tensor.shape) * DATATYPES[tensor.datatype][1]
    if len(tensor.data) != expected:
        raise ValueError(f"a {tensor.datatype} tensor of shape {tensor.shape} has {expected} bytes, "
                         f"not {len(tensor.data)}")
    return tensor


def check_shape(shape: list[int]) -> None:
    if len(shape) > MAX_TENSOR_RANK or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"shape {shape[:MAX_TENSOR_RANK + 1]}: at most {MAX_TENSOR_RANK} whole numbers >= 0")


def elements(shape: list[int]) -> int:
    return math.prod(shape)


def pack(datatype: str, flat: list[Any]) -> bytes:
    """The little-endian bytes of ``flat``'s elements as ``datatype``; ``TypeError``/``OverflowError``/
    ``ValueError`` for an element that is not one (a string, a float for an integer type, out of range)."""
    _, size, fmt = DATATYPES[datatype]
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise TypeError("BOOL elements are true or false")
        return bytes(flat)
    if fmt in "bBhHiIqQ" and not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        raise TypeError(f"{datatype} elements are whole numbers")
    if fmt in "efd" and not all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
        raise TypeError(f"{datatype} elements are numbers")
    if fmt == "e":
        return struct.pack(f"<{len(flat)}e", *flat)
    packed = array.array(fmt, flat)
    if packed.itemsize != size:  # a platform whose C types differ: struct's standard sizes instead
        return struct.pack(f"<{len(flat)}{fmt}", *flat)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(datatype: str, data: bytes | memoryview) -> list[Any]:
    """The elements of a tensor's little-endian bytes, flat."""
    _, size, fmt = DATATYPES[datatype]
    if datatype == "BOOL":
        return [b != 0 for b in bytes(data)]
    if fmt == "e" or sys.byteorder == "big" or array.array(fmt).itemsize != size:
        return list(struct.unpack(f"<{len(data) // size}{fmt}", data))
    return memoryview(data).cast(fmt).tolist()  # type: ignore[call-overload]  # fmt: one of DATATYPES' formats


def compact_of(value: Any) -> msgspec.msgpack.Ext:
    """An output array (numpy's, or anything ``np.asarray`` takes) as a compact tensor."""
    import numpy as np

    array = np.asarray(value)
    datatype = DATATYPE_OF_DTYPE.get(array.dtype.name)
    if datatype is None:
        raise RemoteError(f"the output array's dtype {array.dtype} has no Open Inference Protocol datatype",
                          remote_type="TypeError")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return compact_ext(datatype, list(array.shape), data)


def conform(value: Any, meta: TensorMeta) -> Any:
    """An output array as the function declares it (``meta``): cast to its datatype where numpy casts within the same
    kind (a ``float32`` model whose mean came out ``float64``), its rank and fixed sizes checked; ``RemoteError``
    (``InvalidOutput``) otherwise. What a model's metadata says is what its answers are."""
    import numpy as np

    array = np.asarray(value)
    if meta.datatype and array.dtype.name != DATATYPES[meta.datatype][0]:
        wanted = np.dtype(DATATYPES[meta.datatype][0])
        if not np.can_cast(array.dtype, wanted, casting="same_kind"):
            raise RemoteError(f"the output is {array.dtype}, and the function declares {meta.datatype}",
                              remote_type="InvalidOutput")
        array = array.astype(wanted)
    if meta.shape is not None and (len(meta.shape) != array.ndim or any(
            size not in (-1, got) for size, got in zip(meta.shape, array.shape, strict=True))):
        raise RemoteError(f"the output's shape {list(array.shape)} is not the declared {meta.shape}",
                          remote_type="InvalidOutput")
    return array
