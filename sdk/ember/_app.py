"""``App`` and the decorators that declare what Ember serves."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

import msgspec

from ember import _options as options
from ember._errors import InvalidSpecError
from ember._events import check_events
from ember._handles import Function, MethodHandle
from ember._image import Image, image_field, image_spec
from ember._llm import check_openai, check_openai_io, continuous_io, continuous_spec
from ember._resources import network_field
from ember._schedule import Cron, Period, schedule_spec
from ember._setup import check_not_hook, has_snap_setup, health_check, members
from ember._types import CallIO
from ember._version import __version__
from ember._volume import Volume
from ember._volume import mounts as volume_mounts
from ember.wire import RESERVED_APP_NAMES, Batch, Continuous, FunctionSpec, Manifest, Retries, ServiceSpec
from ember.wire.validate import (
    APP_NAME,
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    PY_NAME,
    STREAM_BATCH_PROBLEM,
    is_app_name,
    manifest_problems,
)

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)



@dataclass
class _Service:
    spec: ServiceSpec
    target: Any  # the Function handle, or the class


class App:
    """A named group of functions and class models that are deployed together.

    Example:
        >>> app = ember.App("hello")
        >>> @app.function()
        ... def greet(name: str) -> str:
        ...     return f"Hello, {name}!"
    """

    def __init__(self, name: str, *, calls: list[str] | None = None, image: Image | None = None) -> None:
        """Args:
            name: the app's name, in its URLs: ``POST /v1/<name>/<fn>``.
            calls: other apps whose functions this app's code calls (``ember.lookup("digits", "predict")
                .remote(x)`` in a function): the platform refuses a call from a replica to an app not named here
                (its own app and ``public=True`` functions need no naming), and the push needs a token that may
                invoke each app named.
            image: the ``ember.Image`` its functions and models run in, unless one names its own (``image=``);
                default: the nodes' own environment.
        """
        if not isinstance(name, str) or not is_app_name(name):
            raise InvalidSpecError(
                f"App({name!r}): an app name is 1-63 lowercase letters, digits and '-', starting with a "
                f"letter or digit, and not one of {sorted(RESERVED_APP_NAMES)}")
        called = [] if calls is None else calls
        if not isinstance(called, list | tuple) or not all(isinstance(a, str) and APP_NAME.fullmatch(a)
                                                            for a in called):
            raise InvalidSpecError(f"App({name!r}, calls={calls!r}): give a list of app names")
        self.name = name
        self.calls = sorted(set(called) - {name})
        self.image = image_spec("App", image)
        self._services: dict[str, _Service] = {}

    def __repr__(self) -> str:
        return f"<ember.App {self.name!r}: {', '.join(self._services) or 'empty'}>"

    @overload
    def function(self, fn: Callable[P, R], /) -> Function[P, R]: ...
    @overload
    def function(self, /, *, gpu: Any = None, min_replicas: int = 1, max_replicas: int | None = None,
                 batch: Batch | Continuous | None = None, timeout_s: float = 60.0,
                 cost: Callable[[Any], float] | None = None,
                 retries: int | Retries = 0, on: str | list[str] | None = None, result_subject: str | None = None,
                 buffer_replicas: int = 0, scaledown_window_s: float = 60.0, memory: int | str | None = None,
                 target_p95_ms: float | None = None, startup_timeout_s: float = 600.0,
                 public: bool = False, secrets: list[str] | None = None,
                 volumes: dict[str, Volume] | None = None, image: Image | None = None,
                 max_body_bytes: int | None = None, max_concurrency: int = 1, block_network: bool = False,
                 openai: str | None = None,
                 schedule: Period | Cron | None = None) -> Callable[[Callable[P, R]], Function[P, R]]: ...

    def function(self, fn: Any = None, /, *, gpu: Any = None, min_replicas: int = 1,
                 max_replicas: int | None = None, batch: Batch | Continuous | None = None, timeout_s: float = 60.0,
                 cost: Callable[[Any], float] | None = None, retries: int | Retries = 0,
                 on: str | list[str] | None = None, result_subject: str | None = None, buffer_replicas: int = 0,
                 scaledown_window_s: float = 60.0, memory: int | str | None = None, block_network: bool = False,
                 target_p95_ms: float | None = None, startup_timeout_s: float = 600.0, public: bool = False,
                 secrets: list[str] | None = None, volumes: dict[str, Volume] | None = None,
                 image: Image | None = None, max_body_bytes: int | None = None, max_concurrency: int = 1,
                 openai: str | None = None,
                 schedule: Period | Cron | None = None) -> Any:
        """Serve a function. Its annotations type the call; the platform validates inputs against them.

        A generator (or async generator) streams its items to the caller (``.remote_gen()``, or Server-Sent Events /
        NDJSON over HTTP); an ``async def`` function runs on the replica's event loop.

        Args:
            gpu: ``None`` (CPU), a GPU count, a GPU type (``"A10G"``, ``"H100:2"``) or a list of types.
            min_replicas: replicas kept warm at all times.
            max_replicas: upper bound on replicas (defaults to ``min_replicas``).
            batch: ``ember.Batch(...)`` to receive calls in batches (the function then takes a list).
            timeout_s: deadline of one call.
            cost: for a batched function, the cost of one input (tokens, pixels...); batches stay under
                ``batch.max_cost``.
            retries: retries of a queued call that fails in user code: a count, or ``ember.Retries(...)``.
            on: NATS subject(s) (wildcards allowed) whose messages invoke the function: the payload is
                its input as JSON, exactly as an HTTP body.
            result_subject: where each event's result is published (a message's ``Ember-Reply-To``
                header overrides it).
            schedule: ``ember.Period(...)`` or ``ember.Cron(...)``: it also runs by itself, once per tick.
            buffer_replicas: idle replicas kept beyond the need while there is load.
            scaledown_window_s: how long the need must stay lower before replicas are removed.
            memory: host memory one replica needs, in MB or as ``"4GB"``: placement counts it against each
                node's RAM, and the node agent against what its replicas reserved.
            target_p95_ms: latency target, in milliseconds, for the 95th percentile of a call's queue wait plus
                run time: while it is exceeded and calls queue, the autoscaler adds replicas. ``None``: no target.
            startup_timeout_s: how long a replica's start (the app's import and its setup) may take; a start
                that takes longer counts as a failed setup (three in a row and the version is failed).
            public: its synchronous call (``POST /v1/<app>/<fn>``) needs no token: a public endpoint. Its spawn,
                its calls' records, logs and everything else of the app still need one.
            secrets: names of secrets (``ember secret set hf --apps my-app HF_TOKEN=...``) whose keys its replicas
                get as environment variables: ``os.environ["HF_TOKEN"]``. Each must exist, for this app, at a push.
            volumes: ``{"/weights": ember.Volume("digits-weights")}``: volumes mounted read-only at those paths in
                its replicas (``ember.mounted("/weights")`` is where a replica without a sandbox finds one). A push
                pins each to its latest version (or ``Volume(..., version=N)``); each must exist then.
            image: the ``ember.Image`` its replicas run in, instead of the app's.
            max_body_bytes: the largest request body its calls take, in bytes (default: the platform's,
                ``EMBER_MAX_BODY_BYTES``, 4 MiB); at most the platform's cap (``EMBER_MAX_BODY_CAP_BYTES``).
            max_concurrency: calls one replica runs at once (1 to 1024): sync code in a pool of that many threads,
                ``async def`` code that many at once on the event loop; the router and autoscaler count that many slots.
            block_network: its replicas reach NATS and nothing else (by default also the internet; never the node).
            openai: serve this generator of text pieces as the model of that name on ``/openai/v1`` (chat and
                completions, streamed or not), or this function of an ``ember.openai.EmbeddingRequest`` (embeddings);
                the name is unique across the platform. See docs/guides/llm.md.
        """
        if fn is not None:
            return self.function()(fn)
        resources = options.resources("@app.function", gpu, min_replicas, max_replicas, timeout_s, retries)
        resources |= options.scaling("@app.function", buffer_replicas, scaledown_window_s, target_p95_ms)
        resources |= options.host_memory("@app.function", memory)
        resources |= options.startup("@app.function", startup_timeout_s)
        resources |= options.secrets("@app.function", secrets)
        resources |= volume_mounts("@app.function", volumes)
        resources |= image_field("@app.function", image, self.image) | network_field("@app.function", block_network)
        _check_batch("@app.function", batch, cost)
        _check_public("@app.function", public)
        body_limit = _body_limit("@app.function", max_body_bytes)
        concurrency = _check_concurrency("@app.function", max_concurrency)
        triggers = check_events("@app.function", on, result_subject)
        model_name = check_openai("@app.function", openai)
        ticks = schedule_spec("@app.function", schedule)

        def decorate(raw: Callable[P, R]) -> Function[P, R]:
            if not inspect.isfunction(raw):
                raise InvalidSpecError(f"@app.function() decorates a function, not {raw!r}")
            check_not_hook("@app.function()", raw)
            _check_name("@app.function()", raw.__name__)
            _check_streaming("@app.function", raw, batch)
            if isinstance(batch, Continuous):
                io = continuous_io()
                function = continuous_spec("@app.function", raw.__name__, raw, batch, model_name, False)
            else:
                io = CallIO.of(raw, batched=batch is not None, is_method=False)
                check_openai_io("@app.function", raw, model_name, io)
                function = _executing(_function_spec(raw.__name__, raw.__name__, io, batch), raw, concurrency)
            handle: Function[P, R] = Function(self.name, raw.__name__, raw, io)
            handle.cost = cost
            function = msgspec.structs.replace(function, on=triggers, result_subject=result_subject, public=public,
                                               max_body_bytes=body_limit, openai=model_name, schedule=ticks)
            spec = ServiceSpec(name=raw.__name__, kind="function", functions=[function], **resources)
            self._register(spec, handle)
            return handle

        return decorate

    def model(self, *, gpu: Any = None, min_replicas: int = 1, max_replicas: int | None = None,
              timeout_s: float = 60.0, retries: int | Retries = 0, buffer_replicas: int = 0,
              scaledown_window_s: float = 60.0, memory: int | str | None = None,
              target_p95_ms: float | None = None, startup_timeout_s: float = 600.0,
              secrets: list[str] | None = None, volumes: dict[str, Volume] | None = None,
              image: Image | None = None, max_concurrency: int = 1, block_network: bool = False) -> Callable[[C], C]:
        """Serve a class: ``@ember.setup`` methods run once per replica, ``@ember.method`` ones serve calls.

        ``max_concurrency``: calls each method runs at once in one replica (see ``App.function``); generator
        methods stream, ``async def`` ones run on the replica's event loop; ``block_network`` as there.

        Example:
            >>> @app.model(gpu=1)
            ... class Classifier:
            ...     @ember.setup
            ...     def load(self): self.net = load_weights()
            ...     @ember.method(batch=ember.Batch(max_size=32))
            ...     def predict(self, images: list[Image]) -> list[Label]: ...
        """
        resources = options.resources("@app.model", gpu, min_replicas, max_replicas, timeout_s, retries)
        resources |= options.scaling("@app.model", buffer_replicas, scaledown_window_s, target_p95_ms)
        resources |= options.host_memory("@app.model", memory)
        resources |= options.startup("@app.model", startup_timeout_s)
        resources |= options.secrets("@app.model", secrets)
        resources |= volume_mounts("@app.model", volumes)
        resources |= image_field("@app.model", image, self.image) | network_field("@app.model", block_network)
        concurrency = _check_concurrency("@app.model", max_concurrency)

        def decorate(cls: C) -> C:
            if not inspect.isclass(cls):
                raise InvalidSpecError(f"@app.model() decorates a class, not {cls!r}")
            _check_name("@app.model()", cls.__name__)
            _check_constructor(cls)
            health_check(cls)  # at most one
            methods = {name: m for name, m in members(cls) if isinstance(m, _MethodDef)}
            if not methods:
                raise InvalidSpecError(f"@app.model(): class {cls.__name__} has no @ember.method to serve")
            functions = [msgspec.structs.replace(m.spec(f"{cls.__name__}.{name}", concurrency), public=m.public,
                                                 max_body_bytes=m.max_body_bytes) for name, m in methods.items()]
            spec = ServiceSpec(name=cls.__name__, kind="class", functions=functions, snap=has_snap_setup(cls),
                               **resources)
            cls.__ember_app__ = self.name  # type: ignore[attr-defined]
            self._register(spec, cls)
            return cls

        return decorate

    def _register(self, spec: ServiceSpec, target: Any) -> None:
        if spec.name in self._services:
            raise InvalidSpecError(f"App {self.name!r} already serves {spec.name!r}; give each function a unique name")
        self._services[spec.name] = _Service(spec, target)

    @property
    def services(self) -> dict[str, ServiceSpec]:
        return {name: s.spec for name, s in self._services.items()}

    def target(self, service: str) -> Any:
        """The served object behind ``service``: a :class:`Function` handle or a class."""
        return self._services[service].target

    def manifest(self, module: str) -> Manifest:
        """The app's specs, as deployed; ``module`` is the app file's import name in its bundle."""
        manifest = Manifest(app=self.name, module=module, services=[s.spec for s in self._services.values()],
                            sdk_version=__version__, python=f"{sys.version_info[0]}.{sys.version_info[1]}",
                            calls=self.calls)
        for field, message in manifest_problems(manifest, "$"):  # what the platform will check again
            raise InvalidSpecError(f"app {self.name!r}, {field}: {message}")
        return manifest


class _MethodDef:
    """What ``@ember.method`` leaves in a class body; a descriptor that hands out method handles."""

    max_body_bytes = 0  # max_body_bytes= of @ember.method; 0: the platform's default

    def __init__(self, raw: Callable[..., Any], batch: Batch | Continuous | None,
                 cost: Callable[[Any], float] | None, public: bool = False, openai: str = "") -> None:
        self.raw = raw
        self.batch = batch
        self.cost = cost
        self.public = public
        self.openai = openai
        _check_streaming("@ember.method", raw, batch)
        self.io = continuous_io() if isinstance(batch, Continuous) else CallIO.of(raw, batched=batch is not None,
                                                                                   is_method=True)
        if not isinstance(batch, Continuous):
            check_openai_io("@ember.method", raw, openai, self.io)
        self.attr = raw.__name__
        self.__doc__ = raw.__doc__
        self.__wrapped__ = raw

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    def spec(self, name: str, concurrency: int) -> FunctionSpec:
        if isinstance(self.batch, Continuous):
            return continuous_spec("@ember.method", name, self.raw, self.batch, self.openai, True)
        spec = _executing(_function_spec(name, self.attr, self.io, self.batch), self.raw, concurrency)
        return msgspec.structs.replace(spec, openai=self.openai)

    def __get__(self, instance: Any, owner: type) -> MethodHandle:
        app = getattr(owner, "__ember_app__", "")
        return MethodHandle(app, f"{owner.__name__}.{self.attr}", self.raw, self.io, owner, instance)


@overload
def method(fn: Callable[..., Any], /) -> Any: ...
@overload
def method(*, batch: Batch | Continuous | None = None, cost: Callable[[Any], float] | None = None,
           public: bool = False, max_body_bytes: int | None = None,
           openai: str | None = None) -> Callable[[Callable[..., Any]], Any]: ...


def method(fn: Any = None, /, *, batch: Batch | Continuous | None = None,
           cost: Callable[[Any], float] | None = None, public: bool = False, max_body_bytes: int | None = None,
           openai: str | None = None) -> Any:
    """Mark a method of an ``@app.model`` class as served; ``batch=`` makes it take a list of inputs.

    ``batch=ember.Continuous(max_seqs=N)``: the method is a decoder's step over the running ``ember.Sequence``s
    (continuous batching). ``openai="NAME"``: served as that model on ``/openai/v1`` (a generator or a step).

    ``cost=`` gives the cost of one input of a batched method (batches stay under ``batch.max_cost``).
    ``public=True``: its synchronous call (``POST /v1/<app>/<Class>.<method>``) needs no token.
    ``max_body_bytes``: the largest request body its calls take (default: the platform's, 4 MiB).
    """
    _check_batch("@ember.method", batch, cost)
    _check_public("@ember.method", public)
    body_limit = _body_limit("@ember.method", max_body_bytes)
    model_name = check_openai("@ember.method", openai)

    def decorate(raw: Callable[..., Any]) -> _MethodDef:
        if not inspect.isfunction(raw):
            raise InvalidSpecError(f"@ember.method decorates a method defined in a class body, not {raw!r}")
        check_not_hook("@ember.method", raw)
        _check_name("@ember.method", raw.__name__)
        definition = _MethodDef(raw, batch, cost, public, model_name)
        definition.max_body_bytes = body_limit
        return definition

    return decorate(fn) if fn is not None else decorate


def method_def(cls: type, attr: str) -> _MethodDef:
    """The ``@ember.method`` behind ``cls.attr`` (used by the runtime to call the raw function)."""
    for klass in cls.__mro__:
        member = klass.__dict__.get(attr)
        if isinstance(member, _MethodDef):
            return member
    raise KeyError(f"{cls.__name__}.{attr} is not an @ember.method")


def _function_spec(name: str, attr: str, io: CallIO, batch: Batch | None) -> FunctionSpec:
    try:
        return FunctionSpec(name=name, attr=attr, input_mode=io.mode, params=io.params,
                            input_schema=io.input_schema(), output_schema=io.output_schema(), batch=batch,
                            tensors=io.tensor_signature())
    except TypeError as exc:
        raise InvalidSpecError(f"{name}(): its annotations are not JSON-able types: {exc}") from exc


def _body_limit(where: str, max_body_bytes: Any) -> int:
    """``max_body_bytes=``: a size in bytes (at most ``MAX_BODY_BYTES``; the platform may cap it lower); None: 0,
    the platform's default."""
    if max_body_bytes is None:
        return 0
    if not options.int_in(max_body_bytes, 1, MAX_BODY_BYTES):
        raise InvalidSpecError(f"{where}(max_body_bytes={max_body_bytes!r}): a whole number of bytes from 1 to "
                               f"{MAX_BODY_BYTES} (the platform may allow less: EMBER_MAX_BODY_CAP_BYTES)")
    return int(max_body_bytes)


def _check_public(where: str, public: Any) -> None:
    if not isinstance(public, bool):
        raise InvalidSpecError(f"{where}(public={public!r}): public is True or False")


def _check_name(where: str, name: str) -> None:
    if not PY_NAME.fullmatch(name):
        raise InvalidSpecError(
            f"{where}: {name!r} cannot name an endpoint; use an ASCII Python name (letters, digits, '_'), "
            "defined with `def` or `class`")


def _check_concurrency(where: str, max_concurrency: Any) -> int:
    if not options.int_in(max_concurrency, 1, MAX_CONCURRENCY):
        raise InvalidSpecError(f"{where}(max_concurrency={max_concurrency!r}): the calls one replica runs at once, "
                               f"an int from 1 to {MAX_CONCURRENCY}")
    return int(max_concurrency)


def _check_streaming(where: str, raw: Callable[..., Any], batch: Any) -> None:
    if isinstance(batch, Batch) and (inspect.isgeneratorfunction(raw) or inspect.isasyncgenfunction(raw)):
        raise InvalidSpecError(f"{where}(batch=...) on {raw.__qualname__}(): {STREAM_BATCH_PROBLEM}")


def _executing(spec: FunctionSpec, raw: Callable[..., Any], max_concurrency: int) -> FunctionSpec:
    """``spec`` with how the replica runs ``raw``: streaming (a generator), on the event loop (``async``), how
    many calls at once."""
    return msgspec.structs.replace(
        spec, stream=inspect.isgeneratorfunction(raw) or inspect.isasyncgenfunction(raw),
        is_async=inspect.iscoroutinefunction(raw) or inspect.isasyncgenfunction(raw), max_concurrency=max_concurrency)


def _check_batch(where: str, batch: Any, cost: Any = None) -> None:
    if isinstance(batch, Continuous):
        if cost is not None:
            raise InvalidSpecError(f"{where}(cost=...): a Continuous step's sequences have no cost; drop cost=")
        return
    if batch is not None and not isinstance(batch, Batch):
        raise InvalidSpecError(
            f"{where}(batch={batch!r}): pass ember.Batch(max_size=..., window_ms=...), "
            f"e.g. batch=ember.Batch(max_size={batch if isinstance(batch, int) else 32})")
    if cost is not None and not callable(cost):
        raise InvalidSpecError(f"{where}(cost={cost!r}): cost is a function of one input returning a number")
    if cost is not None and (batch is None or batch.max_cost is None):
        raise InvalidSpecError(f"{where}(cost=...): a cost function bounds batches by batch.max_cost; "
                               "pass batch=ember.Batch(max_size=..., max_cost=...) too")
    if batch is not None and batch.max_cost is not None and cost is None:
        raise InvalidSpecError(f"{where}(batch=Batch(max_cost={batch.max_cost})): give cost=, the cost of one "
                               "input, e.g. cost=lambda text: len(text)")


def _check_constructor(cls: type) -> None:
    try:
        required = [p for p in list(inspect.signature(cls).parameters.values())
                    if p.default is inspect.Parameter.empty
                    and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if required:
        raise InvalidSpecError(
            f"@app.model(): {cls.__name__}() must be constructible without arguments; load state in an "
            f"@ember.setup method instead of __init__({', '.join(p.name for p in required)})")
