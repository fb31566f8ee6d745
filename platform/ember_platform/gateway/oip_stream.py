"""A decoupled model's call (a generator of arrays, Triton's word): its inputs go as a streamed call does, in JSON
(nested lists, each array of the shape it came in), and each item it yields comes back as one tensor.

The inputs are checked as any inference request's are (``oip_infer.inputs``) before they are written as JSON. An
array declared without a dtype reaches the generator as numpy reads the JSON numbers (int64, float64 or bool), and
an item's datatype is its declared one, else the same reading of its numbers.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from ember._errors import BadRequestError, RemoteError
from ember.wire import Deployment, FunctionSpec
from ember.wire.tensors import MAX_TENSOR_RANK, CompactTensor, TensorMeta, pack, unpack
from ember_platform.platform import Platform

_encoder = msgspec.json.Encoder()
MAX_EMPTY_LISTS = 65_536  # the lists of a tensor without elements that a streamed call's JSON input may hold


def nested(flat: list[Any], shape: list[int]) -> Any:
    """Row-major ``flat`` as nested lists of ``shape`` (a scalar for shape ``[]``). A tensor without elements is its
    lists down to its first size 0 (JSON has nothing for the sizes after it), at most ``MAX_EMPTY_LISTS`` of them:
    ``[2**62, 0]`` has no elements, and its 2**62 empty lists were built in the event loop."""
    if not shape:
        return flat[0]
    if not flat and 0 in shape:
        shape = shape[:shape.index(0) + 1]
        if math.prod(shape[:-1]) > MAX_EMPTY_LISTS:
            raise BadRequestError(f"a tensor of shape {str(shape)[:200]} has no elements, and more than "
                                  f"{MAX_EMPTY_LISTS} empty lists before its first size 0", field="shape")
    rows: list[Any] = flat
    for depth in range(len(shape) - 1, 0, -1):
        size, outer = shape[depth], math.prod(shape[:depth])
        rows = [rows[i * size:(i + 1) * size] for i in range(outer)]
    return rows


def stream_body(tensors: dict[str, CompactTensor], fn: FunctionSpec) -> bytes:
    """The JSON input of the streamed call: its one array, or its arrays by parameter name. JSON has no NaN or
    infinity (msgspec writes null, which came back as NaN, or refused): a tensor holding one is a 400."""
    values = {}
    for name, t in tensors.items():
        flat = unpack(t.datatype, t.data)
        if t.datatype.startswith("FP") and not all(map(math.isfinite, flat)):
            raise BadRequestError(f"input {name!r} holds NaN or infinity, which a decoupled model's JSON input cannot "
                                  "carry", field=name)
        values[name] = nested(flat, t.shape)
    return _encoder.encode(values[fn.params[0]] if fn.input_mode == "single" else values)


def item_tensor(raw: bytes, meta: TensorMeta) -> CompactTensor:
    """One yielded item (JSON) as a tensor; RemoteError when it is not an array of numbers."""
    try:
        value = msgspec.json.decode(raw)
        shape, flat = _shape_and_elements(value)
        datatype = meta.datatype or _datatype_of(flat)
        return CompactTensor(datatype=datatype, shape=shape, data=pack(datatype, flat))
    except (msgspec.MsgspecError, ValueError, TypeError, OverflowError) as exc:
        raise RemoteError(f"an item the model yielded is not a tensor: {exc}", remote_type="TypeError") from exc


def _shape_and_elements(value: Any) -> tuple[list[int], list[Any]]:
    shape: list[int] = []
    probe = value
    while isinstance(probe, list) and len(shape) <= MAX_TENSOR_RANK:
        shape.append(len(probe))
        probe = probe[0] if probe else None
    level = [value]
    for size in shape:
        if not all(isinstance(v, list) and len(v) == size for v in level):
            raise ValueError("its lists are ragged, or nested deeper than a tensor's")
        level = [x for v in level for x in v]
    if any(isinstance(v, list) for v in level):
        raise ValueError("its lists are ragged, or nested deeper than a tensor's")
    return shape, level


def _datatype_of(flat: list[Any]) -> str:
    if flat and all(isinstance(v, bool) for v in flat):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64"
    return "FP64"


async def items(platform: Platform, dep: Deployment, fn: FunctionSpec, tensors: dict[str, CompactTensor], *,
                timeout_s: float, token_id: str) -> AsyncGenerator[CompactTensor, None]:
    """Stream the model's items as tensors, within the caller's quotas (``token_id``: "" for none); the stream
    ends with the error it ended with. Closing this closes the stream (the replica closes the generator)."""
    assert fn.tensors is not None
    output = fn.tensors.outputs[0]
    body = stream_body(tensors, fn)  # its 400 before a slot of the quota is held
    held = platform.quotas.limiter.admit(dep.app, token_id)
    stream = platform.streams.open(dep.app, fn.name, dep.version, body, call_id=os.urandom(16).hex(),
                                   deadline=time.time() + timeout_s)
    try:
        await stream.start()
        while (raws := await stream.next_items()) is not None:
            for raw in raws:
                yield item_tensor(bytes(raw), output)
    finally:
        await stream.aclose()
        if held is not None:
            held.release()
