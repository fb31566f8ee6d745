"""An endpoint: one served function of a replica, its typed decoding and how a batch runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from ember._app import method_def
from ember._errors import EmberError, InvalidInputError, RemoteError
from ember._handles import Function
from ember._inner import current_call
from ember._llm import decode_request
from ember._setup import run_setup, run_teardown
from ember._types import CallIO, invalid_input
from ember.wire import FunctionSpec, ServiceSpec
from ember.wire.openai import Request
from ember_runtime.batching.batcher import Batcher
from ember_runtime.replica.continuous import StepLoop
from ember_runtime.replica.streams import StreamSink, collect_async, collect_sync, drain_async, drain_sync

log = logging.getLogger("ember.replica")


@dataclass(frozen=True)
class Streamed:
    """A streamed call's input: its arguments and where its items go."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    sink: StreamSink


class Endpoint:
    """Decodes one call's body and runs a batch of decoded calls (a batch of one when unbatched).

    ``runner`` is what its batcher calls: ``run`` on an executor thread for sync code, the coroutine ``arun`` on
    the event loop for ``async def`` code. A generator's call streams its items when its input is ``Streamed``
    (a synchronous call) and returns them as one list otherwise (a queued or event call). A sync function with
    ``max_concurrency`` above one has a pool of that many threads of its own (``executor``).
    """

    def __init__(self, spec: FunctionSpec, fn: Callable[..., Any], io: CallIO,
                 cost: Callable[[Any], float] | None = None) -> None:
        self.spec = spec
        self._fn = fn
        self._io = io
        self._cost = cost
        self.batched = spec.batch is not None
        self.executor: ThreadPoolExecutor | None = None
        self.steps: StepLoop | None = None  # a Continuous step's loop, started with the first sequence
        if spec.continuous is not None:
            self.steps = StepLoop(fn, spec.name)
        elif spec.max_concurrency > 1 and not spec.is_async:
            self.executor = ThreadPoolExecutor(max_workers=spec.max_concurrency,
                                               thread_name_prefix=f"ember-{spec.name}")

    @property
    def runner(self) -> Callable[[list[Any]], Any]:
        return self.arun if self.spec.is_async else self.run

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def cost_of(self, value: Any) -> float:
        """The user's cost of one decoded input (1 without a cost function)."""
        if self._cost is None:
            return 1.0
        try:
            return float(self._cost(value))
        except Exception as exc:
            raise RemoteError(f"the cost function failed: {exc}", remote_type=type(exc).__name__) from exc

    def decode(self, body: bytes, codec: str = "json") -> Any:
        """One call's input (JSON, or msgpack from a msgpack frame) as the function's arguments; whatever fails to
        decode it (an input nested deeper than the decoder's stack allows, say) is ``InvalidInputError``: that call's
        error, never the replica's."""
        try:
            if self.steps is not None:
                return (_request_of(body, codec),), {}
            return self._io.decode_item(body, codec) if self.batched else self._io.decode_input(body, codec)
        except EmberError:
            raise
        except RecursionError as exc:
            raise InvalidInputError("the input nests too deeply to decode") from exc
        except Exception as exc:
            raise InvalidInputError(f"the input could not be decoded: {type(exc).__name__}: {exc}") from exc

    def run(self, values: list[Any]) -> list[Any]:
        if self.batched:
            return self._fn(values)
        if self.spec.stream:
            return [self._stream(value) for value in values]
        return [self._fn(*args, **kwargs) for args, kwargs in values]

    def _stream(self, value: tuple[tuple[Any, ...], dict[str, Any]] | Streamed) -> Any:
        if isinstance(value, Streamed):
            drain_sync(self._fn(*value.args, **value.kwargs), value.sink)
            return None
        args, kwargs = value
        return collect_sync(self._fn(*args, **kwargs))

    async def arun(self, values: list[Any]) -> list[Any]:
        if self.steps is not None:
            return [await self._sequence(value) for value in values]
        if self.batched:
            return await self._fn(values)  # type: ignore[no-any-return]
        return [await self._acall(value) for value in values]

    async def _sequence(self, value: tuple[tuple[Any, ...], dict[str, Any]] | Streamed) -> Any:
        """A Continuous step's call: a sequence in its loop until it ends (a queued call gets its pieces)."""
        assert self.steps is not None
        context = current_call()
        call_id, deadline = (context.call_id, context.deadline) if context is not None else ("", float("inf"))
        if isinstance(value, Streamed):
            await self.steps.generate(value.args[0], value.sink.call_id, value.sink.deadline, value.sink)
            return None
        return await self.steps.generate(value[0][0], call_id, deadline, None)

    async def _acall(self, value: tuple[tuple[Any, ...], dict[str, Any]] | Streamed) -> Any:
        if isinstance(value, Streamed):
            await drain_async(self._fn(*value.args, **value.kwargs), value.sink)
            return None
        args, kwargs = value
        if self.spec.stream:
            return await collect_async(self._fn(*args, **kwargs))
        return await self._fn(*args, **kwargs)


def _request_of(body: bytes, codec: str) -> Request:
    try:
        return decode_request(body if codec == "json" else msgspec.json.encode(msgspec.msgpack.decode(body)))
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from exc
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"malformed request: {exc}") from exc


@dataclass(frozen=True)
class Preloaded:
    """What a forked replica inherits from its zygote instead of importing and preparing it itself."""

    service: ServiceSpec
    target: Any
    prepared: Any
    snap_setup_s: float


def prepare(service: ServiceSpec, target: Any) -> Any:
    """What a zygote holds: the class instance with its ``@ember.setup(snap=True)`` methods run (the
    function itself for a function service). Blocking."""
    if service.kind == "function":
        return target
    instance = target()
    run_setup(instance, snap=True)
    return instance


def build_endpoints(service: ServiceSpec, target: Any, prepared: Any = None) -> tuple[list[Endpoint], Any]:
    """Run the service's per-replica setup; one endpoint per function, and the class model's instance (None for a
    function service), whose ``@ember.teardown`` methods run when the replica stops. ``prepared`` is what
    :func:`prepare` returned, in this process or (forked) in a zygote; None: prepare it here.

    Blocking: run it off the event loop.
    """
    if service.kind == "function":
        assert isinstance(target, Function)
        assert target._io is not None
        return [Endpoint(service.functions[0], target.raw, target._io, target.cost)], None
    instance = prepare(service, target) if prepared is None else prepared
    run_setup(instance, snap=False)
    endpoints = []
    for spec in service.functions:
        definition = method_def(target, spec.attr)
        endpoints.append(Endpoint(spec, definition.raw.__get__(instance), definition.io, definition.cost))
    return endpoints, instance


async def tear_down(instance: Any, executor: Executor) -> None:
    """A class model's ``@ember.teardown`` methods (``instance`` None: none), on ``executor``, the model thread that
    ran its setup; each one that raised is printed to stderr with its traceback (the replica still exits cleanly)."""
    if instance is None:
        return
    for name, exc in await asyncio.get_running_loop().run_in_executor(executor, run_teardown, instance):
        log.error("teardown %s() failed", name, exc_info=exc)


RUN_READY = 64  # an unbatched function's ready calls that one hop to the model thread may run, one by one


def batcher_for(endpoint: Endpoint, executor: Executor, serves: Any = None) -> Batcher:
    batch = endpoint.spec.batch
    if batch is None:  # ready calls run back to back in one hop (a stream's call runs alone: it may run long)
        return Batcher(endpoint.runner, max_size=1, window_s=0.0, executor=endpoint.executor or executor,
                       name=endpoint.spec.name, serving=serves, slots=endpoint.spec.max_concurrency,
                       run_ready=1 if endpoint.spec.stream else RUN_READY)
    budget = batch.latency_budget_ms / 1000 if batch.latency_budget_ms is not None else None
    return Batcher(endpoint.runner, max_size=batch.max_size, window_s=batch.window_ms / 1000,
                   executor=endpoint.executor or executor, max_cost=batch.max_cost, latency_budget_s=budget,
                   group_by_cost=batch.group_by_cost, name=endpoint.spec.name, serving=serves,
                   slots=endpoint.spec.max_concurrency)
