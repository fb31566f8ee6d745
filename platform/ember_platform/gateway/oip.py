"""The Open Inference Protocol (KServe v2; Triton's HTTP API) next to Ember's own routes.

A model is a function whose parameters and result are arrays (``FunctionSpec.tensors``), named ``<app>.<fn>``;
its version is the app's. Routes check tokens as Ember's do (the same scopes; an app the token does not see is a
404, as a model that does not exist), and answer errors as the protocol does: ``{"error": "<message>"}``.

An inference request's tensors are checked here, before anything reaches a replica (names, datatypes, shapes,
element counts, the binary extension's sizes); they then travel in a msgpack frame as compact tensors (their bytes,
never JSON numbers), and the replica answers its array the same way. The binary tensor extension
(``Inference-Header-Content-Length``) works both ways; a raw binary request (a header length of 0) does not.
"""

from __future__ import annotations

import functools
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, EmberError, NotFoundError, RemoteError
from ember._version import __version__
from ember.wire import Deployment, FunctionSpec, ServiceSpec, error_from_info
from ember.wire.oip import (
    IndexRequest,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelReady,
    OipError,
    RepositoryModel,
    ServerMetadata,
)
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
    unpack,
)
from ember_platform.auth.scopes import INVOKE, READ
from ember_platform.auth.tokens import TokenRefused
from ember_platform.gateway import binary, calls
from ember_platform.gateway.body import header, read_body
from ember_platform.gateway.errors import path_methods
from ember_platform.gateway.guard import TOKEN, Need, authorize, checks_itself, principal_of
from ember_platform.gateway.metrics import CALLED
from ember_platform.gateway.responses import platform_of
from ember_platform.platform import Platform

HEADER_LENGTH = "Inference-Header-Content-Length"
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
EXTENSIONS = ["binary_tensor_data", "model_repository", "model_configuration"]
MAX_INPUTS = 64
_request_decoder = msgspec.json.Decoder(InferRequest)
_index_decoder = msgspec.json.Decoder(IndexRequest)
_encoder = msgspec.json.Encoder()
Handler = Callable[[Request], Awaitable[Response]]


def oip_errors(handler: Handler) -> Handler:
    """Answer the handler's errors as the protocol does, ``{"error": "<message>"}`` with the status of Ember's
    error (and its ``Retry-After`` and ``WWW-Authenticate``)."""
    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except EmberError as exc:
            return error_response(exc)

    return answered


def error_response(exc: EmberError) -> Response:
    message = f"{exc} ({exc.field})" if exc.field and exc.field not in str(exc) else str(exc)
    response = _json(OipError(error=message), exc.http_status)
    if exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, TokenRefused):
        response.headers["WWW-Authenticate"] = exc.challenge
    return response


def _json(value: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status_code=status, media_type="application/json")


# -- health and server ----------------------------------------------------------------------------

async def live(_request: Request) -> Response:
    """``GET /v2/health/live``: the control plane answers."""
    return _json({"live": True})


async def ready(request: Request) -> Response:
    """``GET /v2/health/ready``: the control plane can take calls (NATS connected, state loaded), as ``/readyz``."""
    is_ready = platform_of(request).ready()
    return _json({"ready": is_ready}, 200 if is_ready else 503)


@checks_itself(READ)
@oip_errors
async def server_metadata(request: Request) -> Response:
    """``GET /v2``."""
    authorize(request, READ)
    return _json(ServerMetadata(name="ember", version=__version__, extensions=EXTENSIONS))


@checks_itself(TOKEN)
@oip_errors
async def unknown(request: Request) -> Response:
    """Any other ``/v2/...`` path (with a token: without one, nobody learns what is served): the protocol's 404; a
    path the protocol has, asked with another method (``POST /v2/health/live``), is a 405 with ``Allow``."""
    if path_methods(request):
        raise HTTPException(405)
    authorize(request, TOKEN)
    raise NotFoundError(f"no route {request.method} {request.url.path[:200]} (the Open Inference Protocol's "
                        "routes are /v2, /v2/health/..., /v2/repository/index and /v2/models/<app>.<fn>/...)")


# -- models ----------------------------------------------------------------------------------------

def _model(request: Request, need: Need) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
    """The model a path names (``<app>.<fn>``, in the version it names, else the one the traffic split draws), once
    the request may ``need`` it: a token that does not see the app gets the 404 of a model that does not exist; a
    function that is not a model (its parameters or result are not arrays) is a 404 too."""
    platform = platform_of(request)
    model = request.path_params["model"]
    app, dot, name = model.partition(".")
    raw_version = request.path_params.get("version")
    try:
        if not dot or not name:
            raise NotFoundError(f"no model named {model[:200]!r}: a model is named <app>.<function>")
        pinned = _version(raw_version) if raw_version is not None else None
        dep, svc, fn = platform.registry.route(app, name, pinned, random.random())
    except NotFoundError:
        authorize(request, need, app or "-")  # without the right token, nobody learns which apps exist
        raise
    if not (need == INVOKE and fn.public):
        authorize(request, need, app)
    if fn.tensors is None:
        raise NotFoundError(f"{model!r} is not a model: its parameters and result are not all numpy.ndarray")
    return dep, svc, fn


def _version(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or int(raw) < 1:
        raise NotFoundError(f"no version {raw[:40]!r}: a version is a whole number from 1")
    return int(raw)


def _ready_replicas(platform: Platform, dep: Deployment, svc: ServiceSpec) -> int:
    return sum(1 for r in platform.registry.live_replicas(dep.app, svc.name)
               if r.state == "ready" and r.version == dep.version)


@checks_itself(READ)
@oip_errors
async def model_metadata(request: Request) -> Response:
    """``GET /v2/models/<model>[/versions/<v>]``: its inputs (the parameters) and output, with datatype and shape
    (-1: any size; a dtype-less array shows datatype "" and a shape-less one ``[-1]``)."""
    dep, _, fn = _model(request, READ)
    assert fn.tensors is not None

    def shown(meta: TensorMeta) -> TensorMeta:
        return TensorMeta(name=meta.name, datatype=meta.datatype, shape=meta.shape if meta.shape is not None else [-1])

    return _json(ModelMetadata(name=request.path_params["model"], versions=[str(dep.version)], platform="ember",
                               inputs=[shown(m) for m in fn.tensors.inputs],
                               outputs=[shown(m) for m in fn.tensors.outputs]))


@checks_itself(READ)
@oip_errors
async def model_ready(request: Request) -> Response:
    """``GET /v2/models/<model>[/versions/<v>]/ready``: 200 while a replica of that version is ready, else 503."""
    dep, svc, _ = _model(request, READ)
    is_ready = _ready_replicas(platform_of(request), dep, svc) > 0
    return _json(ModelReady(name=request.path_params["model"], ready=is_ready), 200 if is_ready else 503)


@checks_itself(READ)
@oip_errors
async def model_config(request: Request) -> Response:
    """``GET /v2/models/<model>[/versions/<v>]/config``: Triton's model configuration, as far as Ember has one: the
    inputs and output with their ``TYPE_`` datatypes and dims, no batching dimension (``max_batch_size`` 0)."""
    _, _, fn = _model(request, READ)
    assert fn.tensors is not None

    def tensor(meta: TensorMeta) -> dict[str, Any]:
        return {"name": meta.name, "data_type": f"TYPE_{meta.datatype}" if meta.datatype else "TYPE_INVALID",
                "dims": meta.shape if meta.shape is not None else [-1]}

    return _json({"name": request.path_params["model"], "platform": "ember", "backend": "ember", "max_batch_size": 0,
                  "input": [tensor(m) for m in fn.tensors.inputs], "output": [tensor(m) for m in fn.tensors.outputs]})


@checks_itself(READ)
@oip_errors
async def list_models(request: Request) -> Response:
    """``GET /v2/models`` (as KServe's server): the names of the models of the apps the token sees."""
    platform = platform_of(request)
    principal = authorize(request, READ)
    return _json({"models": [f"{app}.{fn.name}" for app, dep in sorted(platform.registry.deployments.items.items())
                             if principal.sees(app) for svc in dep.manifest.services for fn in svc.functions
                             if fn.tensors is not None]})


@checks_itself(READ)
@oip_errors
async def repository_index(request: Request) -> Response:
    """``POST /v2/repository/index`` (``{"ready": true}``: only the ready ones): the models of the apps the token
    sees, each in its current version."""
    platform = platform_of(request)
    principal = authorize(request, READ)
    body = await read_body(request, 64 * 1024)
    try:
        only_ready = _index_decoder.decode(body).ready if body.strip() else False
    except msgspec.MsgspecError as exc:
        raise BadRequestError(f"malformed repository index request: {exc}") from exc
    models = []
    for app, dep in sorted(platform.registry.deployments.items.items()):
        if not principal.sees(app):
            continue
        for svc in dep.manifest.services:
            for fn in svc.functions:
                if fn.tensors is None:
                    continue
                up = _ready_replicas(platform, dep, svc) > 0
                if up or not only_ready:
                    models.append(RepositoryModel(name=f"{app}.{fn.name}", version=str(dep.version),
                                                  state="READY" if up else "UNAVAILABLE",
                                                  reason="" if up else "no replica is ready"))
    return _json(models)


# -- inference -------------------------------------------------------------------------------------

@checks_itself(INVOKE)
@oip_errors
async def infer(request: Request) -> Response:
    """``POST /v2/models/<model>[/versions/<v>]/infer``: check the tensors, call the function, answer its array
    (as JSON numbers, or as binary data when asked)."""
    platform = platform_of(request)
    dep, svc, fn = _model(request, INVOKE)
    assert fn.tensors is not None
    request.scope[CALLED] = (dep.app, fn.name, dep.version)  # what GET /metrics counts this call under
    encoding = header(request, b"content-encoding")
    if encoding not in (None, "identity"):
        raise binary.UnsupportedMediaType(f"Content-Encoding {encoding[:40]!r} is not supported; send the body "
                                          "uncompressed", field="Content-Encoding")
    model = request.path_params["model"]
    body = await binary.read_call_body(request, platform, dep.app, fn)
    req, tail = _split(body, header(request, _HEADER_LENGTH))
    tensors = _inputs(req, tail, fn)
    payload = msgspec.msgpack.encode(tensors[fn.params[0]] if fn.input_mode == "single" else tensors)
    wanted = _outputs(req, fn)
    timeout_s = _timeout(req, svc.timeout_s)
    token_id = "" if fn.public else principal_of(request).token_id  # ``_model`` authorized it
    held = platform.quotas.limiter.admit(dep.app, token_id)
    call_id = os.urandom(16).hex()
    try:
        call = platform.router.call(dep.app, fn.name, dep.version, payload, call_id=call_id,
                                    deadline=time.time() + timeout_s, packed=True, compact=True)
        reply = await calls._unless_disconnected(request, call)
    finally:
        if held is not None:
            held.release()
    if reply is None:
        return Response(status_code=499)
    if reply.error is not None:
        raise error_from_info(reply.error)
    output = _output(bytes(reply.output))
    return _answer(InferResponse(model_name=model, model_version=str(dep.version), id=req.id, outputs=[]),
                   output, wanted)


def _split(body: bytes, declared: str | None) -> tuple[InferRequest, memoryview]:
    """The JSON header (all of the body, or its first ``Inference-Header-Content-Length`` bytes) and the rest."""
    size = len(body)
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 12:
            raise BadRequestError(f"{HEADER_LENGTH} is a whole number of bytes", field=HEADER_LENGTH)
        size = int(declared)
        if size == 0:
            raise BadRequestError(f"a raw binary request ({HEADER_LENGTH}: 0) is not supported: send a JSON header "
                                  "naming the input", field=HEADER_LENGTH)
        if size > len(body):
            raise BadRequestError(f"{HEADER_LENGTH} ({size}) is more than the body's {len(body)} bytes",
                                  field=HEADER_LENGTH)
    view = memoryview(body)
    try:
        req = _request_decoder.decode(view[:size])
    except msgspec.ValidationError as exc:
        raise BadRequestError(f"inference request: {exc}") from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadRequestError(f"malformed JSON in the inference request: {exc}") from exc
    return req, view[size:]


def _inputs(req: InferRequest, tail: memoryview, fn: FunctionSpec) -> dict[str, msgspec.msgpack.Ext]:
    """Each input as a compact tensor, checked against the model's inputs; ``BadRequestError`` naming the input."""
    assert fn.tensors is not None
    declared = {meta.name: meta for meta in fn.tensors.inputs}
    if len(req.inputs) > MAX_INPUTS:
        raise BadRequestError(f"{len(req.inputs)} inputs: the model takes {len(declared)}", field="inputs")
    tensors: dict[str, msgspec.msgpack.Ext] = {}
    offset = 0
    for i, given in enumerate(req.inputs):
        meta = declared.get(given.name)
        if meta is None:
            raise BadRequestError(f"unknown input {given.name[:100]!r}: the model's inputs are "
                                  f"{', '.join(declared)}", field=f"inputs[{i}].name")
        if given.name in tensors:
            raise BadRequestError(f"input {given.name!r} is given twice", field=f"inputs[{i}].name")
        data, used = _tensor_bytes(given, meta, tail[offset:], f"inputs[{i}]")
        offset += used
        tensors[given.name] = compact_ext(given.datatype, list(given.shape), data)
    if offset != len(tail):
        raise BadRequestError(f"{len(tail) - offset} bytes after the JSON header belong to no input "
                              "(binary_data_size)", field=HEADER_LENGTH)
    missing = [name for name in declared if name not in tensors]
    if missing:
        raise BadRequestError(f"missing input {missing[0]!r}: the model's inputs are {', '.join(declared)}",
                              field="inputs")
    return tensors


def _tensor_bytes(given: InferInput, meta: TensorMeta, tail: memoryview, at: str) -> tuple[bytes, int]:
    """An input's little-endian bytes (from the binary section, or packed from its JSON data) and how many bytes of
    the binary section it took."""
    name = given.name
    if given.datatype not in DATATYPES:
        known = ", ".join(DATATYPES)
        raise BadRequestError(f"input {name!r}: datatype {given.datatype[:40]!r} is not supported (one of {known})",
                              field=f"{at}.datatype")
    if meta.datatype and given.datatype != meta.datatype:
        raise BadRequestError(f"input {name!r}: datatype {given.datatype}, but the model takes {meta.datatype}",
                              field=f"{at}.datatype")
    shape = list(given.shape)
    if len(shape) > MAX_TENSOR_RANK or any(isinstance(d, bool) or d < 0 for d in shape):
        raise BadRequestError(f"input {name!r}: shape {shape[:MAX_TENSOR_RANK + 1]} is not one of at most "
                              f"{MAX_TENSOR_RANK} sizes >= 0", field=f"{at}.shape")
    if meta.shape is not None and (len(shape) != len(meta.shape)
                                   or any(want not in (-1, got) for want, got in zip(meta.shape, shape, strict=True))):
        raise BadRequestError(f"input {name!r}: shape {shape}, but the model takes {meta.shape} (-1: any size)",
                              field=f"{at}.shape")
    itemsize = DATATYPES[given.datatype][1]
    count = elements(shape)
    size = given.parameters.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequestError(f"input {name!r}: binary_data_size is a whole number of bytes",
                                  field=f"{at}.parameters.binary_data_size")
        if size != count * itemsize:
            raise BadRequestError(f"input {name!r}: binary_data_size {size}, but a {given.datatype} tensor of shape "
                                  f"{shape} has {count * itemsize} bytes", field=f"{at}.parameters.binary_data_size")
        if size > len(tail):
            raise BadRequestError(f"input {name!r}: binary_data_size {size} is more than the {len(tail)} bytes left "
                                  "after the JSON header", field=f"{at}.parameters.binary_data_size")
        return bytes(tail[:size]), size
    if given.data is None:
        raise BadRequestError(f"input {name!r} has neither data nor parameters.binary_data_size", field=f"{at}.data")
    if count * itemsize > len(tail) + 64 * 1024 * 1024:  # a shape far beyond any body: refused before counting
        raise BadRequestError(f"input {name!r}: shape {shape} has {count} elements", field=f"{at}.shape")
    flat = _flatten(given.data, name, f"{at}.data")
    if len(flat) != count:
        raise BadRequestError(f"input {name!r} has {len(flat)} elements, but its shape {shape} needs {count}",
                              field=f"{at}.data")
    try:
        return pack(given.datatype, flat), 0
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise BadRequestError(f"input {name!r}: {exc}", field=f"{at}.data") from exc


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


def _outputs(req: InferRequest, fn: FunctionSpec) -> bool:
    """Whether the output goes as binary data (``binary_data_output`` on the request, or ``binary_data`` on the
    requested output); an unknown output is a 400."""
    assert fn.tensors is not None
    names = [meta.name for meta in fn.tensors.outputs]
    binary_all = req.parameters.get("binary_data_output") is True
    for i, wanted in enumerate(req.outputs or []):
        if wanted.name not in names:
            raise BadRequestError(f"unknown output {wanted.name[:100]!r}: the model's outputs are {', '.join(names)}",
                                  field=f"outputs[{i}].name")
        binary_all = binary_all or wanted.parameters.get("binary_data") is True
    return binary_all


def _timeout(req: InferRequest, limit: float) -> float:
    """The request's ``timeout`` parameter (microseconds, as Triton's), within the function's ``timeout_s``."""
    raw = req.parameters.get("timeout")
    if raw is None:
        return limit
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise BadRequestError("parameters.timeout is a whole number of microseconds", field="parameters.timeout")
    return min(raw / 1e6, limit)


def _output(raw: bytes) -> CompactTensor:
    """The function's answer as a tensor (it answers compact tensors in a msgpack frame)."""
    try:
        value = msgspec.msgpack.decode(raw)
        if not isinstance(value, msgspec.msgpack.Ext) or value.code != TENSOR_EXT:
            raise ValueError(f"it returned a {type(value).__name__}, not an array")
        return read_compact(value.data)
    except (msgspec.MsgspecError, ValueError) as exc:
        raise RemoteError(f"the model's output is not a tensor: {exc}", remote_type="TypeError") from exc


def _answer(response: InferResponse, output: CompactTensor, as_binary: bool) -> Response:
    if as_binary:
        out = InferOutput(name="output", datatype=output.datatype, shape=output.shape,
                          parameters={"binary_data_size": len(output.data)})
    else:
        out = InferOutput(name="output", datatype=output.datatype, shape=output.shape,
                          data=unpack(output.datatype, output.data))
    head = _encoder.encode(msgspec.structs.replace(response, outputs=[out]))
    if not as_binary:
        return Response(head, media_type="application/json")
    return Response(head + output.data, media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(head))})

