"""Warm-up batches at the sizes the batcher will use, so that the first calls do not pay for them."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sized
from typing import TypeVar

from ember._errors import InvalidSpecError

T = TypeVar("T")


def warm_up(fn: Callable[[list[T]], Sized], example_item: T, sizes: Iterable[int], *,
            repeats: int = 1) -> dict[int, float]:
    """Run ``fn`` on batches of ``example_item`` at each size; return the seconds each size took.

    Call it from ``@ember.setup`` with the batched function's own body, so that kernels, allocator pools
    and autotuning are ready before the replica reports ready. The largest size runs first: a replica
    that cannot fit its largest batch fails in setup, not under its first load. GPU work is synchronised
    before a run is timed, so the timings are honest batch costs (the last of ``repeats`` runs counts).

    Args:
        fn: takes a list of items and returns one output per item.
        example_item: a typical input; each batch repeats it.
        sizes: batch sizes, e.g. ``(1, 8, 32)`` or a TensorRT engine's profile sizes.
        repeats: runs per size.

    Raises:
        ValueError: ``fn`` returned a different number of outputs than it was given.

    Example:
        >>> @ember.setup
        ... def load(self):
        ...     self.net = ember.backends.torch.load_module(Net, "weights.pt")
        ...     ember.backends.warm_up(self._forward, Image(pixels=[0.0] * 64), sizes=(1, 8, 32))
    """
    checked = _check_sizes(sizes)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidSpecError(f"warm_up(repeats={repeats!r}): repeats is an int >= 1")
    timings: dict[int, float] = {}
    for size in sorted(checked, reverse=True):
        for _ in range(repeats):
            timings[size] = _timed_run(fn, example_item, size)
    return dict(sorted(timings.items()))


def _check_sizes(sizes: Iterable[int]) -> set[int]:
    checked = set(sizes)
    if not checked or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in checked):
        raise InvalidSpecError(f"warm_up(sizes={sizes!r}): sizes are one or more ints >= 1, e.g. (1, 8, 32)")
    return checked


def _timed_run(fn: Callable[[list[T]], Sized], item: T, size: int) -> float:
    start = time.perf_counter()
    outputs = fn([item] * size)
    _synchronize()
    elapsed = time.perf_counter() - start
    if len(outputs) != size:
        raise ValueError(f"warm_up(): {getattr(fn, '__name__', fn)!s} returned {len(outputs)} outputs for a "
                         f"batch of {size}; a batched function returns one output per input")
    return elapsed


def _synchronize() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
