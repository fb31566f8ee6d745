"""A batch's spans, when tracing is on (see ``ember._tracing``): ``ember.batch`` linked to the ``ember.call`` span of
every call in it, ``ember.run`` below it for the function's run, and each call's ``ember.queue`` (from its arrival
to the batch's start, linked to the batch).

The batch is a child of its first call's span, so that a call alone in its batch has its whole path in one trace;
the other calls reach it through the links. Calls that were not sampled have no spans of theirs (a batch of only
such calls has none at all). While the batch runs, ``ember.run`` is the current span: spans the function itself
starts with OpenTelemetry's API are its children.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ember import _tracing as tracing


@dataclass(frozen=True, slots=True)
class BatchSpans:
    batch: Any
    run: Any
    token: Any  # the run made current (detached at the end)


def begin(spans: Sequence[Any], function: str, size: int) -> BatchSpans | None:
    """Start the spans of a batch of ``size`` calls whose ``ember.call`` spans are ``spans`` (those that have one);
    None when no call of the batch is recorded (none was sampled): nobody would see them."""
    spans = [s for s in spans if s.is_recording()]
    if not spans:
        return None
    now = time.time_ns()
    head = spans[0]
    attributes = {"ember.function": function, "ember.batch.size": size}
    batch = tracing.start("ember.batch", tracing.context_of(head), start_ns=now,
                          links=[s.get_span_context() for s in spans], attributes=attributes)
    link = [batch.get_span_context()]
    for span in spans:
        arrived = min(getattr(span, "start_time", None) or now, now)
        queue = tracing.start("ember.queue", tracing.context_of(span), start_ns=arrived, links=link)
        queue.end(end_time=now)
    run = tracing.start("ember.run", tracing.context_of(batch), start_ns=now, attributes=attributes)
    return BatchSpans(batch, run, tracing.activate(run))


def end(spans: BatchSpans) -> None:
    """End the batch's spans (each call's outcome is on its own ``ember.call``)."""
    tracing.deactivate(spans.token)
    tracing.end(spans.run)
    tracing.end(spans.batch)


def call(carrier: Any, call_id: str, function: str, *, kind: str = "server", start_ns: int | None = None,
         attributes: dict[str, Any] | None = None) -> Any:
    """A call's ``ember.call`` span, the child of the trace context it came with (``carrier``: an ``Invocation``'s
    ``trace`` or a message's headers; a missing or malformed one starts a new trace); None for a call whose trace is
    not sampled (``tracing.unsampled``): no span of it would be recorded."""
    if tracing.unsampled(carrier):
        return None
    return tracing.start("ember.call", tracing.parent_from(carrier), kind=kind, start_ns=start_ns,
                         attributes={"ember.call_id": call_id, "ember.function": function, **(attributes or {})})


def answered(span: Any, error: Any) -> None:
    """End a call's span once it is answered (``error``: the ``EmberError`` it failed with, or None)."""
    tracing.end(span, getattr(error, "code", None) or (type(error).__name__ if error is not None else None))


def ending(span: Any, answer: Callable[[Any, Any, int], Awaitable[None]]) -> Callable[[Any, Any, int], Awaitable[None]]:
    """``answer`` (a call's), which then ends the call's span."""
    async def answer_then_end(output: Any, error: Any, batch_size: int) -> None:
        try:
            await answer(output, error, batch_size)
        finally:
            answered(span, error)

    return answer_then_end
