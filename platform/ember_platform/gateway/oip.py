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
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, EmberError, NotFoundError
from ember._version import __version__
from ember.wire import Deployment, FunctionSpec, ServiceSpec
from ember.wire.oip import (
    IndexRequest,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelReady,
    OipError,
    RepositoryModel,
    ServerMetadata,
)
from ember.wire.tensors import CompactTensor, TensorMeta, unpack
from ember_platform.auth.scopes import INVOKE, READ
from ember_platform.auth.tokens import TokenRefused
from ember_platform.gateway import binary, calls, oip_infer
from ember_platform.gateway.body import header, read_body
from ember_platform.gateway.errors import path_methods
from ember_platform.gateway.guard import TOKEN, Need, authorize, checks_itself, principal_of
from ember_platform.gateway.metrics import CALLED
from ember_platform.gateway.responses import platform_of

HEADER_LENGTH = "Inference-Header-Content-Length"
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
EXTENSIONS = ["binary_tensor_data", "model_repository", "model_configuration"]
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
    """The model a path names, once the request may ``need`` it (``oip_infer.find_model``)."""
    return oip_infer.find_model(platform_of(request), request.path_params["model"],
                                request.path_params.get("version"), need,
                                lambda need, app: authorize(request, need, app))


@checks_itself(READ)
@oip_errors
async def model_metadata(request: Request) -> Response:
    """``GET /v2/models/<model>[/versions/<v>]``: its inputs (the parameters) and output, with datatype and shape
    (-1: any size; a dtype-less array shows datatype "" and a shape-less one ``[-1]``)."""
    dep, _, fn = _model(request, READ)
    assert fn.tensors is not None
    return _json(ModelMetadata(name=request.path_params["model"], platform="ember",
                               versions=oip_infer.versions_of(platform_of(request), dep, fn.name),
                               inputs=[oip_infer.shown(m) for m in fn.tensors.inputs],
                               outputs=[oip_infer.shown(m) for m in fn.tensors.outputs]))


@checks_itself(READ)
@oip_errors
async def model_ready(request: Request) -> Response:
    """``GET /v2/models/<model>[/versions/<v>]/ready``: 200 while a replica of that version is ready, else 503."""
    dep, svc, _ = _model(request, READ)
    is_ready = oip_infer.ready_replicas(platform_of(request), dep, svc) > 0
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
                  "input": [tensor(m) for m in fn.tensors.inputs], "output": [tensor(m) for m in fn.tensors.outputs],
                  "model_transaction_policy": {"decoupled": fn.stream}})


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
                up = oip_infer.ready_replicas(platform, dep, svc) > 0
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
    model = request.path_params["model"]
    oip_infer.not_decoupled(model, fn, "HTTP's infer")
    request.scope[CALLED] = (dep.app, fn.name, dep.version)  # what GET /metrics counts this call under
    encoding = header(request, b"content-encoding")
    if encoding not in (None, "identity"):
        raise binary.UnsupportedMediaType(f"Content-Encoding {encoding[:40]!r} is not supported; send the body "
                                          "uncompressed", field="Content-Encoding")
    body = await binary.read_call_body(request, platform, dep.app, fn)
    req, tail = _split(body, header(request, _HEADER_LENGTH))
    tensors = oip_infer.inputs(req, fn, oip_infer.BodyTail(tail, HEADER_LENGTH))
    wanted = oip_infer.wants_binary(req, fn)
    timeout_s = oip_infer.timeout_of(req, svc.timeout_s)
    token_id = "" if fn.public else principal_of(request).token_id  # ``_model`` authorized it
    output = await oip_infer.call(platform, dep, fn, tensors, timeout_s=timeout_s, token_id=token_id,
                                  watch=lambda call: calls._unless_disconnected(request, call))
    if output is None:
        return Response(status_code=499)
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

