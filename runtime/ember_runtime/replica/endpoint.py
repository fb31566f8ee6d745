"""An endpoint: one served function of a replica, its typed decoding and how a batch runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember._app import method_def
from ember._errors import RemoteError
from ember._handles import Function
from ember._setup import run_setup
from ember._types import CallIO
from ember.wire import FunctionSpec, ServiceSpec


class Endpoint:
    """Decodes one call's body and runs a batch of decoded calls (a batch of one when unbatched)."""

    def __init__(self, spec: FunctionSpec, fn: Callable[..., Any], io: CallIO,
                 cost: Callable[[Any], float] | None = None) -> None:
        self.spec = spec
        self._fn = fn
        self._io = io
        self._cost = cost
        self.batched = spec.batch is not None

    def cost_of(self, value: Any) -> float:
        """The user's cost of one decoded input (1 without a cost function)."""
        if self._cost is None:
            return 1.0
        try:
            return float(self._cost(value))
        except Exception as exc:
            raise RemoteError(f"the cost function failed: {exc}", remote_type=type(exc).__name__) from exc

    def decode(self, body: bytes) -> Any:
        return self._io.decode_item(body) if self.batched else self._io.decode_input(body)

    def run(self, values: list[Any]) -> list[Any]:
        if self.batched:
            return self._fn(values)
        return [self._fn(*args, **kwargs) for args, kwargs in values]


def prepare(service: ServiceSpec, target: Any) -> Any:
    """What a zygote holds: the class instance with its ``@ember.setup(snap=True)`` methods run (the
    function itself for a function service). Blocking."""
    if service.kind == "function":
        return target
    instance = target()
    run_setup(instance, snap=True)
    return instance


def build_endpoints(service: ServiceSpec, target: Any, prepared: Any = None) -> list[Endpoint]:
    """Run the service's per-replica setup and return one endpoint per function. ``prepared`` is what
    :func:`prepare` returned, in this process or (forked) in a zygote; None: prepare it here.

    Blocking: run it off the event loop.
    """
    if service.kind == "function":
        assert isinstance(target, Function)
        assert target._io is not None
        return [Endpoint(service.functions[0], target.raw, target._io, target.cost)]
    instance = prepare(service, target) if prepared is None else prepared
    run_setup(instance, snap=False)
    endpoints = []
    for spec in service.functions:
        definition = method_def(target, spec.attr)
        endpoints.append(Endpoint(spec, definition.raw.__get__(instance), definition.io, definition.cost))
    return endpoints
