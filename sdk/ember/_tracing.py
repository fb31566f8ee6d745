"""Tracing with OpenTelemetry (the ``tracing`` extra): a call's spans from the gateway, through NATS, to the replica.

Off unless the standard environment asks for it: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, or ``OTEL_TRACES_EXPORTER`` set to ``otlp`` or ``console``; and never
with ``OTEL_SDK_DISABLED=true``. The exporter then reads the rest of its settings (headers, timeouts, batching:
``OTEL_BSP_*``; sampling: ``OTEL_TRACES_SAMPLER``; ``OTEL_RESOURCE_ATTRIBUTES``) from the same environment, as every
OpenTelemetry SDK does. Off, a call costs one test of a module attribute (``tracing.ON``) at each place a span would
start, and OpenTelemetry is never imported.

The spans of one synchronous call:

- ``ember.gateway`` (server) in the control plane, a child of the client's W3C ``traceparent`` when it sent a
  valid one (a malformed one is ignored: the call starts a new trace); the gateway sends its own trace context on
  with the call, inside its ``Invocation`` (several calls share one NATS message, each with its own context);
- ``ember.call`` (server) in the replica, a child of the gateway's span, from the call's arrival to its answer;
- ``ember.queue``, a child of ``ember.call``: the time the call waited for its batch, linked to that batch;
- ``ember.batch``, one per batch, linked to the ``ember.call`` of every call in it (a batch has many callers) and a
  child of the first of them, so that a lone call's trace holds its whole path;
- ``ember.run``, a child of ``ember.batch``: the function's run.

A queued call (``.../spawn``) gets ``ember.spawn`` (server) at the gateway, its context travels in the JetStream
message's ``traceparent`` header, and the replica's ``ember.call`` (consumer) is its child, with the same
``ember.queue``, ``ember.batch`` and ``ember.run`` below; an event published with a ``traceparent`` header is
traced the same way from its publisher's span.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACEPARENT = 256  # version 00 is 55 characters; later versions may add fields
MAX_TRACESTATE = 512  # the W3C's recommended limit; a longer one is dropped (the trace itself continues)
FLUSH_LIMIT_S = 5.0  # the most a stopping process waits for its last spans to leave
_EXPORTERS = ("otlp", "console")
log = logging.getLogger(__name__)
T = TypeVar("T")

ON = False  # True in a process that traces (``setup``): the one test the call path makes when tracing is off
_tracer: Any = None
_propagator: Any = None
_api: Any = None  # OpenTelemetry's API modules, imported once tracing starts (``_propagation``)
_parent_based = True  # the sampler follows a parent's decision (OTEL_TRACES_SAMPLER=parentbased_*, the default)
_TRACEPARENT_00 = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return any(name.strip() in _EXPORTERS for name in exporter.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def setup(service_name: str, attributes: Mapping[str, str | int] | None = None) -> bool:
    """Start tracing in this process if its environment asks for it (see ``wanted``); True when it is on.

    ``service_name`` unless ``OTEL_SERVICE_NAME`` names another; ``attributes`` join the resource (with those of
    ``OTEL_RESOURCE_ATTRIBUTES``). Without the ``opentelemetry-sdk`` package, or with an exporter it cannot make,
    it logs why and stays off: tracing never stops a process from serving."""
    global ON, _tracer, _parent_based
    if ON or not wanted():
        return ON
    try:
        provider = _provider(service_name, attributes or {})
    except ImportError as exc:
        log.warning("tracing is asked for (OTEL_* variables) but %s is not installed: pip install 'ember[tracing]'; "
                    "tracing stays off", exc.name or exc)
        return False
    except Exception as exc:
        log.warning("tracing stays off: %s: %s", type(exc).__name__, exc)
        return False
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("ember")
    sampler = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    _parent_based = sampler.startswith("parentbased_")
    _propagation()
    ON = True
    log.info("tracing on: spans of %s exported (%s)", service_name, os.environ.get("OTEL_TRACES_EXPORTER", "otlp"))
    return True


def _provider(service_name: str, attributes: Mapping[str, str | int]) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, which Ember does not ship (otlp, console): skipped", name)
    resource = Resource.create({**attributes, "service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class _Api:
    """What the call path uses of OpenTelemetry's API, imported once (not on each span)."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.context, self.trace, self.Link, self.Status, self.ERROR = context, trace, Link, Status, StatusCode.ERROR
        self.kinds = {kind.name.lower(): kind for kind in SpanKind}
        self.internal = SpanKind.INTERNAL
        self.empty = context.Context()
        self.propagator = TraceContextTextMapPropagator()


def _propagation() -> Any:
    global _propagator, _api
    if _api is None:
        _api = _Api()
        _propagator = _api.propagator
    return _propagator


def shutdown() -> None:
    """Flush the spans not yet exported and stop the exporter (at a process's exit), waiting at most
    ``FLUSH_LIMIT_S``: a collector that does not answer does not hold a stopping process."""
    global ON
    if not ON:
        return
    ON = False
    from opentelemetry import trace

    provider = trace.get_tracer_provider()

    def flush() -> None:
        try:
            provider.shutdown()  # type: ignore[attr-defined]
        except Exception as exc:
            log.warning("flushing the last spans failed: %s", exc)

    flushing = threading.Thread(target=flush, name="ember-trace-flush", daemon=True)
    flushing.start()
    flushing.join(FLUSH_LIMIT_S)
    if flushing.is_alive():
        log.warning("the last spans were not exported within %g s: they are dropped", FLUSH_LIMIT_S)


def parent_from(carrier: Mapping[str, str] | None) -> Any:
    """The OpenTelemetry ``Context`` that the ``traceparent`` (and ``tracestate``) in ``carrier`` name, or None
    (a new trace) for a missing or malformed one. ``carrier`` is hostile input (an HTTP request's or a NATS
    message's headers): the propagator parses it strictly, and an oversized value is not even read.
    Header names are matched in any case."""
    if not carrier:
        return None
    parent = carrier.get(TRACEPARENT)
    state = carrier.get(TRACESTATE)
    if parent is None and isinstance(carrier, dict) and len(carrier) <= 64:  # NATS headers keep their case
        for key, value in carrier.items():
            lowered = key.lower() if isinstance(key, str) else ""
            if lowered == TRACEPARENT:
                parent = value
            elif lowered == TRACESTATE:
                state = value
    if not isinstance(parent, str) or not parent or len(parent) > MAX_TRACEPARENT:
        return None
    clean = {TRACEPARENT: parent}
    if isinstance(state, str) and state and len(state) <= MAX_TRACESTATE:
        clean[TRACESTATE] = state
    context = _propagation().extract(clean)
    return context if _api.trace.get_current_span(context).get_span_context().is_valid else None


def unsampled(carrier: Mapping[str, str] | None) -> bool:
    """Whether ``carrier`` holds a valid ``traceparent`` (version 00) of a trace that is not sampled, under a sampler
    that follows its parent: then no span this process starts for it would be recorded, and none need be (a
    replica's call that carries one skips all span work). False whenever in doubt: the SDK decides then, as for
    any call."""
    if not carrier or not _parent_based:
        return False
    parent = carrier.get(TRACEPARENT)
    if parent is None and isinstance(carrier, dict) and len(carrier) <= 64:  # NATS headers keep their case
        parent = next((v for k, v in carrier.items() if isinstance(k, str) and k.lower() == TRACEPARENT), None)
    return (isinstance(parent, str) and len(parent) == 55 and _TRACEPARENT_00.fullmatch(parent) is not None
            and not int(parent[53:], 16) & 1)


def start(name: str, parent: Any = None, *, kind: str = "internal", start_ns: int | None = None,
          links: list[Any] | None = None, attributes: Mapping[str, Any] | None = None) -> Any:
    """A started span, a child of ``parent`` (a ``Context``; None: a new trace), linked to the span contexts in
    ``links``; end it with ``end``."""
    return _tracer.start_span(name, context=parent if parent is not None else _api.empty,
                              kind=_api.kinds.get(kind, _api.internal), start_time=start_ns,
                              links=[_api.Link(c) for c in links] if links else (), attributes=attributes)


def end(span: Any, error: str | None = None, end_ns: int | None = None) -> None:
    """End ``span``; with ``error`` (an Ember error code, say) it is marked failed."""
    if error:
        span.set_attribute("error.type", error)
        span.set_status(_api.Status(_api.ERROR, error))
    span.end(end_time=end_ns)


def context_of(span: Any) -> Any:
    """The ``Context`` whose current span is ``span`` (the parent of its children)."""
    return _api.trace.set_span_in_context(span)


def headers_of(span: Any) -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) that carry ``span`` to another process."""
    carrier: dict[str, str] = {}
    _propagation().inject(carrier, context=context_of(span))
    return carrier


def activate(span: Any) -> Any:
    """Make ``span`` the current one in this task (``current_headers`` reads it); a token for ``deactivate``."""
    return _api.context.attach(_api.trace.set_span_in_context(span))


def deactivate(token: Any) -> None:
    _api.context.detach(token)


def current_headers(attributes: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The trace context of this task's current span, to send on with a call (empty when there is none); the
    current span is given ``attributes`` first."""
    span = _api.trace.get_current_span()
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    if not context.trace_flags.sampled:  # nothing of it is recorded: only the context travels on, written here
        carrier = {TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"}
        if context.trace_state:
            carrier[TRACESTATE] = context.trace_state.to_header()
        return carrier
    if attributes:
        span.set_attributes(attributes)
    return headers_of(span)


async def within(name: str, carrier: Mapping[str, str] | None, work: Awaitable[T], *, kind: str = "server") -> T:
    """Await ``work`` with a span named ``name`` as the current one, a child of the trace context in ``carrier`` (a
    NATS message's headers, say: hostile input as any)."""
    span = start(name, parent_from(carrier), kind=kind)
    token = activate(span)
    failed = None
    try:
        return await work
    except BaseException as exc:
        failed = type(exc).__name__
        raise
    finally:
        deactivate(token)
        end(span, failed)
