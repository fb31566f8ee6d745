"""The Open Inference Protocol's inference, whichever transport carries it: HTTP's ``/v2`` routes (``oip``) and
gRPC's ``inference.GRPCInferenceService`` (``oip_grpc``) find a model, check its inputs, call it and read its answer
with these functions, so that both refuse the same input with the same message, naming the same field.

An input's elements come as numbers (HTTP's JSON ``data``, gRPC's typed ``contents``) or as bytes (the binary tensor
extension's section after the JSON header, gRPC's ``raw_input_contents``): a ``Binary`` source says which bytes are
whose. A generator of arrays is a decoupled model, in Triton's words: its items stream over gRPC's
``ModelStreamInfer`` (``oip_stream``); ``infer`` refuses it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import msgspec

from ember._errors import BadRequestError, EmberError, NotFoundError, RemoteError
from ember.wire import Answer, Deployment, FunctionSpec, ServiceSpec, error_from_info
from ember.wire.oip import InferInput, InferRequest
from ember.wire.tensors import (
    DATATYPES,
    MAX_TENSOR_RANK,
    TENSOR_EXT,
    CompactTensor,
    TensorMeta,
    compact_ext,
    elements,
    pack,
    read_compact,
)
from ember_platform.auth.scopes import INVOKE
from ember_platform.control import rollout
from ember_platform.gateway.guard import Need
from ember_platform.platform import Platform

MAX_INPUTS = 64
Check = Callable[[Need, str], object]  # raises unless the caller may do what ``need`` says on the app
Watch = Callable[[Coroutine[Any, Any, Answer]], Awaitable[Answer | None]]  # None: the caller went away


class Unsupported(EmberError):
    """What the protocol has but this model or server does not do (Triton's UNSUPPORTED: HTTP 501, gRPC
    UNIMPLEMENTED)."""

    code = "unsupported"
    http_status = 501


# -- models ----------------------------------------------------------------------------------------

def find_model(platform: Platform, model: str, raw_version: str | None, need: Need,
               check: Check) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
    """The model ``<app>.<fn>`` names (in the version given; else, to infer, the one the traffic split draws, and to
    read its metadata, readiness or configuration, the one that takes the app's calls: ``rollout.main``, the same at
    every read during a rollout), once ``check`` says the caller may ``need`` it: a caller who does not see the app
    gets the NotFoundError of a model that does not exist; a function that is not a model (its parameters or result
    are not arrays) is not found either."""
    app, dot, name = model.partition(".")
    try:
        if not dot or not name:
            raise NotFoundError(f"no model named {model[:200]!r}: a model is named <app>.<function>")
        pinned = version_of(raw_version) if raw_version is not None else None
        if pinned is None and need != INVOKE and (whole := platform.registry.deployments.items.get(app)) is not None:
            pinned = rollout.main(whole).version
        dep, svc, fn = platform.registry.route(app, name, pinned, random.random())
    except NotFoundError:
        check(need, app or "-")  # without the right token, nobody learns which apps exist
        raise
    if not (need == INVOKE and fn.public):
        check(need, app)
    if fn.tensors is None:
        raise NotFoundError(f"{model!r} is not a model: its parameters and result are not all numpy.ndarray")
    return dep, svc, fn


def versions_of(platform: Platform, dep: Deployment, name: str) -> list[str]:
    """The versions of ``dep``'s app that take its calls and serve ``name`` as a model, oldest first (Triton's
    ``versions``)."""
    whole = platform.registry.deployments.items.get(dep.app) or dep
    found = [share.version for share in whole.serving() if (at := whole.at(share.version)) is not None
             and any(f.name == name and f.tensors is not None for svc in at.manifest.services for f in svc.functions)]
    return [str(v) for v in sorted(found)] or [str(dep.version)]


def version_of(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or int(raw) < 1:
        raise NotFoundError(f"no version {raw[:40]!r}: a version is a whole number from 1")
    return int(raw)


def ready_replicas(platform: Platform, dep: Deployment, svc: ServiceSpec) -> int:
    return sum(1 for r in platform.registry.live_replicas(dep.app, svc.name)
               if r.state == "ready" and r.version == dep.version)


def shown(meta: TensorMeta) -> TensorMeta:
    """A tensor as metadata shows it: a shape-less one as ``[-1]``."""
    return TensorMeta(name=meta.name, datatype=meta.datatype, shape=meta.shape if meta.shape is not None else [-1])


def not_decoupled(model: str, fn: FunctionSpec, how: str) -> None:
    """Refuse a generator's call through ``how`` (its items stream over gRPC's ModelStreamInfer alone)."""
    if fn.stream:
        raise Unsupported(f"{model!r} is a decoupled model (a generator): {how} does not take it; stream its items "
                          "with gRPC's ModelStreamInfer")


# -- inputs ----------------------------------------------------------------------------------------

class Binary(Protocol):
    """Where inputs' bytes are, for the inputs that come as bytes."""

    data_name: str  # where elements as numbers go: "data", "contents"
    binary_name: str  # where bytes go

    def left(self) -> int:
        """Bytes not taken yet."""

    def take(self, index: int, given: InferInput, at: str, expected: int) -> bytes | None:
        """The bytes of input ``index`` (None: its elements come as numbers), exactly ``expected`` of them."""

    def finish(self) -> None:
        """Refuse bytes that belong to no input."""


class BodyTail:
    """The binary tensor extension: the bytes after the JSON header, each input's ``parameters.binary_data_size``
    of them in turn."""

    data_name = "data"
    binary_name = "parameters.binary_data_size"

    def __init__(self, tail: memoryview, header: str) -> None:
        self.tail = tail
        self.offset = 0
        self.header = header

    def left(self) -> int:
        return len(self.tail) - self.offset

    def take(self, index: int, given: InferInput, at: str, expected: int) -> bytes | None:
        size = given.parameters.get("binary_data_size")
        if size is None:
            return None
        name, field = given.name, f"{at}.parameters.binary_data_size"
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequestError(f"input {name!r}: binary_data_size is a whole number of bytes", field=field)
        if size != expected:
            raise BadRequestError(f"input {name!r}: binary_data_size {size}, but a {given.datatype} tensor of shape "
                                  f"{list(given.shape)} has {expected} bytes", field=field)
        if size > self.left():
            raise BadRequestError(f"input {name!r}: binary_data_size {size} is more than the {self.left()} bytes "
                                  "left after the JSON header", field=field)
        data = bytes(self.tail[self.offset:self.offset + size])
        self.offset += size
        return data

    def finish(self) -> None:
        if self.left():
            raise BadRequestError(f"{self.left()} bytes after the JSON header belong to no input "
                                  "(binary_data_size)", field=self.header)


def inputs(req: InferRequest, fn: FunctionSpec, binary: Binary) -> dict[str, CompactTensor]:
    """Each input as a compact tensor, checked against the model's inputs; ``BadRequestError`` naming the input."""
    assert fn.tensors is not None
    declared = {meta.name: meta for meta in fn.tensors.inputs}
    if len(req.inputs) > MAX_INPUTS:
        raise BadRequestError(f"{len(req.inputs)} inputs: the model takes {len(declared)}", field="inputs")
    tensors: dict[str, CompactTensor] = {}
    for i, given in enumerate(req.inputs):
        meta = declared.get(given.name)
        if meta is None:
            raise BadRequestError(f"unknown input {given.name[:100]!r}: the model's inputs are "
                                  f"{', '.join(declared)}", field=f"inputs[{i}].name")
        if given.name in tensors:
            raise BadRequestError(f"input {given.name!r} is given twice", field=f"inputs[{i}].name")
        data = _tensor_bytes(i, given, meta, binary, f"inputs[{i}]")
        tensors[given.name] = CompactTensor(datatype=given.datatype, shape=list(given.shape), data=data)
    binary.finish()
    missing = [name for name in declared if name not in tensors]
    if missing:
        raise BadRequestError(f"missing input {missing[0]!r}: the model's inputs are {', '.join(declared)}",
                              field="inputs")
    return tensors


def _tensor_bytes(index: int, given: InferInput, meta: TensorMeta, binary: Binary, at: str) -> bytes:
    """An input's little-endian bytes (given as bytes, or packed from its elements)."""
    name = given.name
    if given.datatype not in DATATYPES:
        known = ", ".join(DATATYPES)
        raise BadRequestError(f"input {name!r}: datatype {given.datatype[:40]!r} is not supported (one of {known})",
                              field=f"{at}.datatype")
    if meta.datatype and given.datatype != meta.datatype:
        raise BadRequestError(f"input {name!r}: datatype {given.datatype}, but the model takes {meta.datatype}",
                              field=f"{at}.datatype")
    shape = list(given.shape)
    if len(shape) > MAX_TENSOR_RANK or any(isinstance(d, bool) or not 0 <= d < 2**63 for d in shape):
        raise BadRequestError(f"input {name!r}: shape {str(shape[:MAX_TENSOR_RANK + 1])[:200]} is not one of at most "
                              f"{MAX_TENSOR_RANK} sizes >= 0 and below 2**63", field=f"{at}.shape")
    if meta.shape is not None and (len(shape) != len(meta.shape)
                                   or any(want not in (-1, got) for want, got in zip(meta.shape, shape, strict=True))):
        raise BadRequestError(f"input {name!r}: shape {shape}, but the model takes {meta.shape} (-1: any size)",
                              field=f"{at}.shape")
    count = elements(shape)
    expected = count * DATATYPES[given.datatype][1]
    data = binary.take(index, given, at, expected)
    if data is not None:
        return data
    if given.data is None:
        raise BadRequestError(f"input {name!r} has neither {binary.data_name} nor {binary.binary_name}",
                              field=f"{at}.{binary.data_name}")
    if expected > binary.left() + 64 * 1024 * 1024:  # a shape far beyond any body: refused before counting
        raise BadRequestError(f"input {name!r}: shape {shape} has {count} elements", field=f"{at}.shape")
    where = f"{at}.{binary.data_name}"
    flat = _flatten(given.data, name, where)
    if len(flat) != count:
        raise BadRequestError(f"input {name!r} has {len(flat)} elements, but its shape {shape} needs {count}",
                              field=where)
    try:
        return pack(given.datatype, flat)
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise BadRequestError(f"input {name!r}: {exc}", field=where) from exc


def _flatten(data: Any, name: str, at: str) -> list[Any]:
    """Tensor data, nested or flat, as one flat list (row-major)."""
    flat = data if isinstance(data, list) else [data]
    for _ in range(MAX_TENSOR_RANK + 1):
        nested = [isinstance(v, list) for v in flat]
        if not any(nested):
            return flat
        if not all(nested):
            raise BadRequestError(f"input {name!r}: its data mixes lists and numbers at one depth", field=at)
        flat = [x for v in flat for x in v]
    raise BadRequestError(f"input {name!r}: its data is nested deeper than {MAX_TENSOR_RANK}", field=at)


def wants_binary(req: InferRequest, fn: FunctionSpec) -> bool:
    """Whether the output goes as binary data (``binary_data_output`` on the request, or ``binary_data`` on the
    requested output); an unknown output is a BadRequestError."""
    assert fn.tensors is not None
    names = [meta.name for meta in fn.tensors.outputs]
    binary_all = req.parameters.get("binary_data_output") is True
    for i, wanted in enumerate(req.outputs or []):
        if wanted.name not in names:
            raise BadRequestError(f"unknown output {wanted.name[:100]!r}: the model's outputs are {', '.join(names)}",
                                  field=f"outputs[{i}].name")
        binary_all = binary_all or wanted.parameters.get("binary_data") is True
    return binary_all


def timeout_of(req: InferRequest, limit: float) -> float:
    """The request's ``timeout`` parameter (microseconds, as Triton's), within the function's ``timeout_s``."""
    raw = req.parameters.get("timeout")
    if raw is None:
        return limit
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise BadRequestError("parameters.timeout is a whole number of microseconds", field="parameters.timeout")
    return min(raw / 1e6, limit) if raw < 2**63 else limit  # past any limit (and past what a float holds)


# -- the call --------------------------------------------------------------------------------------

def payload(tensors: dict[str, CompactTensor], fn: FunctionSpec) -> bytes:
    """The call's msgpack input: its one array, or its arrays by parameter name, as compact tensors."""
    exts = {name: compact_ext(t.datatype, t.shape, t.data) for name, t in tensors.items()}
    return msgspec.msgpack.encode(exts[fn.params[0]] if fn.input_mode == "single" else exts)


async def call(platform: Platform, dep: Deployment, fn: FunctionSpec, tensors: dict[str, CompactTensor], *,
               timeout_s: float, token_id: str, watch: Watch | None = None) -> CompactTensor | None:
    """Call the model within the caller's quotas (``token_id``: "" for none) and read its array; None when
    ``watch`` saw the caller go away. The call's own error is raised."""
    body = payload(tensors, fn)
    held = platform.quotas.limiter.admit(dep.app, token_id)
    try:
        sent = platform.router.call(dep.app, fn.name, dep.version, body, call_id=os.urandom(16).hex(),
                                    deadline=time.time() + timeout_s, packed=True, compact=True)
        reply = await (watch(sent) if watch is not None else sent)
    finally:
        if held is not None:
            held.release()
    if reply is None:
        return None
    if reply.error is not None:
        raise error_from_info(reply.error)
    return output_tensor(bytes(reply.output))


def output_tensor(raw: bytes) -> CompactTensor:
    """The function's answer as a tensor (it answers compact tensors in a msgpack frame)."""
    try:
        value = msgspec.msgpack.decode(raw)
        if not isinstance(value, msgspec.msgpack.Ext) or value.code != TENSOR_EXT:
            raise ValueError(f"it returned a {type(value).__name__}, not an array")
        return read_compact(value.data)
    except (msgspec.MsgspecError, ValueError) as exc:
        raise RemoteError(f"the model's output is not a tensor: {exc}", remote_type="TypeError") from exc
