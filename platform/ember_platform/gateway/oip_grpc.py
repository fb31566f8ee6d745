"""The Open Inference Protocol over gRPC: Triton's and KServe's ``inference.GRPCInferenceService``, on a port of its
own (``--grpc-port``), served by grpc.aio in the control plane's event loop beside the HTTP API.

It checks what HTTP's ``/v2`` routes check, with their functions (``oip_infer``): the same bearer token, sent as
``authorization: Bearer <token>`` metadata, with the same scopes (an app the token does not see is NOT_FOUND, as a
model that does not exist); the same limits (a request over its function's body limit, or over the largest any
function takes, is RESOURCE_EXHAUSTED; so is an overload or a quota's refusal, with ``retry-after`` metadata); the
same tensor checks, answered INVALID_ARGUMENT naming the field. ``ServerLive`` and ``ServerReady`` need no token,
as HTTP's probes. Outputs always come as ``raw_output_contents``, as Triton sends them.

``ModelStreamInfer`` takes one request after another on its stream. A decoupled model (a generator of arrays)
answers each item it yields as one response whose ``triton_final_response`` parameter is false, then, when the
request asked for it (``triton_enable_empty_final_response``, as ``tritonclient``'s ``enable_empty_final_response``
does), an empty response where it is true; any other model answers one response, final. An error ends that
request with a response holding ``error_message``, and the stream goes on; a refused token ends the stream
(UNAUTHENTICATED).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc import aio

from ember._errors import EmberError
from ember._version import __version__
from ember.wire import FRAME_ITEM_OVERHEAD_BYTES, Deployment, FunctionSpec, ServiceSpec
from ember.wire.tensors import CompactTensor
from ember_platform.auth.scopes import INVOKE, READ, Principal
from ember_platform.auth.tokens import TokenRefused
from ember_platform.gateway import oip_infer, oip_stream
from ember_platform.gateway.binary import body_limit, over_limit
from ember_platform.gateway.guard import TOKEN, Need
from ember_platform.gateway.oip_grpc_requests import infer_request, status_of
from ember_platform.gateway.oip_proto import grpc_service_pb2 as pb
from ember_platform.gateway.oip_proto import grpc_service_pb2_grpc as pb_grpc
from ember_platform.platform import Platform

log = logging.getLogger("ember.grpc")
STOP_GRACE_S = 10.0  # what calls in flight are given when the control plane stops (as uvicorn's graceful shutdown)
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
EXTENSIONS = ["model_repository"]  # HTTP's binary_tensor_data and model_configuration are HTTP's alone
T = TypeVar("T")


class _Caller:
    """Who calls: the principal of the RPC's ``authorization`` metadata, authenticated when first needed."""

    def __init__(self, platform: Platform, context: aio.ServicerContext) -> None:
        self.platform = platform
        self.context = context
        self._principal: Principal | None = None

    def principal(self) -> Principal:
        if self._principal is None:
            given = next((str(v) for k, v in self.context.invocation_metadata() or () if k == "authorization"), None)
            self._principal = self.platform.tokens.authenticate(given)
        return self._principal

    def check(self, need: Need, app: str | None = None) -> Principal:
        principal = self.principal()
        if need != TOKEN:
            principal.require(need, app)
        return principal


async def _answered(context: aio.ServicerContext, work: Awaitable[T]) -> T:
    """``work``'s result; its EmberError as the RPC's status (an unexpected error: INTERNAL, logged)."""
    try:
        return await work
    except EmberError as exc:
        failure = exc
    except Exception:
        log.exception("a gRPC call failed")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the control plane's log")
    trailing = (("retry-after", str(max(1, math.ceil(failure.retry_after_s)))),) \
        if failure.retry_after_s is not None else ()
    await context.abort(status_of(failure), str(failure), trailing_metadata=trailing)
    raise AssertionError("abort raises")  # for the type checker: context.abort never returns


class Service(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs Ember serves; every other one of the service answers UNIMPLEMENTED."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.platform.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: aio.ServicerContext) -> pb.ServerMetadataResponse:
        async def work() -> pb.ServerMetadataResponse:
            _Caller(self.platform, context).check(READ)
            return pb.ServerMetadataResponse(name="ember", version=__version__, extensions=EXTENSIONS)

        return await _answered(context, work())

    def _model(self, caller: _Caller, name: str, version: str,
               need: Need) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
        return oip_infer.find_model(self.platform, name, version or None, need, caller.check)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> pb.ModelReadyResponse:
        async def work() -> pb.ModelReadyResponse:
            dep, svc, _ = self._model(_Caller(self.platform, context), request.name, request.version, READ)
            return pb.ModelReadyResponse(ready=oip_infer.ready_replicas(self.platform, dep, svc) > 0)

        return await _answered(context, work())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: aio.ServicerContext) -> pb.ModelMetadataResponse:
        async def work() -> pb.ModelMetadataResponse:
            dep, _, fn = self._model(_Caller(self.platform, context), request.name, request.version, READ)
            assert fn.tensors is not None

            def tensors(metas: list[Any]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
                return [pb.ModelMetadataResponse.TensorMetadata(name=m.name, datatype=m.datatype, shape=m.shape)
                        for m in map(oip_infer.shown, metas)]

            return pb.ModelMetadataResponse(name=request.name, platform="ember",
                                            versions=oip_infer.versions_of(self.platform, dep, fn.name),
                                            inputs=tensors(fn.tensors.inputs), outputs=tensors(fn.tensors.outputs))

        return await _answered(context, work())

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: aio.ServicerContext) -> pb.RepositoryIndexResponse:
        async def work() -> pb.RepositoryIndexResponse:
            principal = _Caller(self.platform, context).check(READ)
            models = []
            for app, dep in sorted(self.platform.registry.deployments.items.items()):
                for svc in dep.manifest.services if principal.sees(app) else ():
                    up = oip_infer.ready_replicas(self.platform, dep, svc) > 0
                    models += [pb.RepositoryIndexResponse.ModelIndex(
                        name=f"{app}.{fn.name}", version=str(dep.version), state="READY" if up else "UNAVAILABLE",
                        reason="" if up else "no replica is ready")
                        for fn in svc.functions if fn.tensors is not None and (up or not request.ready)]
            return pb.RepositoryIndexResponse(models=models)

        return await _answered(context, work())

    async def ModelInfer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> pb.ModelInferResponse:
        async def work() -> pb.ModelInferResponse:
            call = self._checked(_Caller(self.platform, context), request, context, "ModelInfer")
            dep, fn, tensors, timeout_s, token_id = call
            output = await oip_infer.call(self.platform, dep, fn, tensors, timeout_s=timeout_s, token_id=token_id)
            assert output is not None  # no watch: a client that goes away cancels this task
            return _response(request, dep, output)

        return await _answered(context, work())

    def _checked(self, caller: _Caller, request: pb.ModelInferRequest, context: aio.ServicerContext,
                 how: str) -> tuple[Deployment, FunctionSpec, dict[str, CompactTensor], float, str]:
        """What a call of the model needs, checked as HTTP's infer checks it: the model, the caller's right to
        call it, the size of the request, its inputs and requested outputs, its timeout; and its quotas' key."""
        dep, svc, fn = self._model(caller, request.model_name, request.model_version, INVOKE)
        if how == "ModelInfer":
            oip_infer.not_decoupled(request.model_name, fn, "gRPC's ModelInfer")
        size = request.ByteSize()
        if size > body_limit(self.platform, fn):
            raise over_limit(self.platform, dep.app, fn, f"the request's {size} bytes are over the limit")
        req, raw = infer_request(request)
        tensors = oip_infer.inputs(req, fn, raw)
        oip_infer.wants_binary(req, fn)  # the requested outputs: an unknown one is refused
        left = context.time_remaining()
        timeout_s = min(oip_infer.timeout_of(req, svc.timeout_s), left if left is not None else math.inf)
        token_id = "" if fn.public else caller.principal().token_id
        return dep, fn, tensors, timeout_s, token_id

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for request in request_iterator:
            caller = _Caller(self.platform, context)  # each request's token checked again: revoked, expired, ...
            try:
                async for response in self._streamed(caller, request, context):
                    yield pb.ModelStreamInferResponse(infer_response=response)
            except TokenRefused as exc:
                await context.abort(status_of(exc), str(exc))
            except EmberError as exc:  # with the request's id and model, as Triton answers: the client knows which
                yield pb.ModelStreamInferResponse(error_message=str(exc), infer_response=pb.ModelInferResponse(
                    id=request.id, model_name=request.model_name, model_version=request.model_version))

    async def _streamed(self, caller: _Caller, request: pb.ModelInferRequest,
                        context: aio.ServicerContext) -> AsyncIterator[pb.ModelInferResponse]:
        dep, fn, tensors, timeout_s, token_id = self._checked(caller, request, context, "ModelStreamInfer")
        if not fn.stream:
            output = await oip_infer.call(self.platform, dep, fn, tensors, timeout_s=timeout_s, token_id=token_id)
            assert output is not None
            yield _response(request, dep, output, final=True)
            return
        items = oip_stream.items(self.platform, dep, fn, tensors, timeout_s=timeout_s, token_id=token_id)
        try:
            async for item in items:
                yield _response(request, dep, item, final=False)
        finally:
            await items.aclose()
        final = request.parameters.get(EMPTY_FINAL)
        if final is not None and final.bool_param:
            yield pb.ModelInferResponse(model_name=request.model_name, model_version=str(dep.version),
                                        id=request.id, parameters={FINAL: pb.InferParameter(bool_param=True)})


def _response(request: pb.ModelInferRequest, dep: Deployment, output: CompactTensor,
              final: bool | None = None) -> pb.ModelInferResponse:
    tensor = pb.ModelInferResponse.InferOutputTensor(name="output", datatype=output.datatype, shape=output.shape)
    parameters = {FINAL: pb.InferParameter(bool_param=final)} if final is not None else {}
    return pb.ModelInferResponse(model_name=request.model_name, model_version=str(dep.version), id=request.id,
                                 outputs=[tensor], raw_output_contents=[output.data], parameters=parameters)


def max_message_bytes(platform: Platform) -> int:
    """The largest request any function takes (``binary.body_limit`` with the highest ``max_body_bytes``): gRPC
    refuses a longer message before reading it; each call is then held to its own function's limit."""
    return min(platform.settings.max_body_cap_bytes, platform.nc.max_payload - FRAME_ITEM_OVERHEAD_BYTES)


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serving(host: str, port: int, *, reuse_port: bool = False,
            url_file: Path | None = None) -> Callable[[Platform], contextlib.AbstractAsyncContextManager[str]]:
    """What serves the service on ``host:port`` (0: a free port) while the platform runs: entered once the platform
    has started, it listens, writes ``host:port`` to ``url_file``, and gives it; leaving it stops intake and gives
    the calls in flight ``STOP_GRACE_S`` to finish."""
    @contextlib.asynccontextmanager
    async def serve(platform: Platform) -> AsyncIterator[str]:
        server = aio.server(options=[("grpc.max_receive_message_length", max_message_bytes(platform)),
                                     ("grpc.so_reuseport", 1 if reuse_port else 0)])
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Service(platform), server)
        bound = server.add_insecure_port(address(host, port))
        await server.start()
        try:
            served = address(host, bound)
            log.info("serving the Open Inference Protocol over gRPC on %s", served)
            if url_file is not None:
                tmp = url_file.with_suffix(".tmp")
                tmp.write_text(served)
                tmp.replace(url_file)
            yield served
        finally:
            await server.stop(STOP_GRACE_S)

    return serve
