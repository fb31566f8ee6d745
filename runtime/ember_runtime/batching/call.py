"""One call as the batcher holds it, from its arrival to its answer."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ember._errors import EmberError
from ember_runtime.batching.running import Run

Answer = Callable[[Any, EmberError | None, int], Awaitable[None]]


@dataclass(eq=False)
class Call:
    """One queued call: its decoded input, deadline (epoch seconds), priority and how to answer it."""

    value: Any
    deadline: float
    answer: Answer
    call_id: str = ""
    priority: str = "interactive"
    cost: float = 1.0
    enqueued_at: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    seq: int = 0  # arrival order, the last tie-breaker of the queue's order
    chain: list[Any] = field(default_factory=list)  # a call from a function: the calls waiting on it (wire ``Hop``s)
    span: Any = None  # its ``ember.call`` span, when tracing is on (see ``spans``)
    run: Run | None = None  # the batch it runs in, once it runs

    def deadline_mono(self) -> float:
        return self.deadline - time.time() + time.monotonic() if math.isfinite(self.deadline) else math.inf
