"""What a batch costs: a least-squares fit of ``seconds = a + b·n`` over a replica's recent batches.

``a`` is the fixed cost of running a batch at all (dispatch, kernel launches, the thread hop); ``b`` the
cost of each item. The batcher waits for more calls only when the next one is expected sooner than ``a``
(waiting then saves a whole batch's fixed cost) and refuses calls it predicts cannot meet their deadline.
"""

from __future__ import annotations

import math
from collections import deque

MIN_SAMPLES = 4


class CostModel:
    """Recent ``(batch size, seconds)`` observations and the line through them."""

    def __init__(self, window: int = 64, *, a: float | None = None, b: float | None = None) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._prior = (a, b) if a is not None and b is not None else None
        self._fit: tuple[float, float] | None = self._prior

    def observe(self, n: int, seconds: float) -> None:
        self._samples.append((n, seconds))
        if len(self._samples) >= MIN_SAMPLES:
            self._fit = _least_squares(self._samples)

    @property
    def fitted(self) -> bool:
        return self._fit is not None

    @property
    def fixed_s(self) -> float:
        """``a``: the cost of a batch regardless of its size (0 until fitted)."""
        return self._fit[0] if self._fit else 0.0

    def predict(self, n: int) -> float:
        """Seconds a batch of ``n`` is expected to take (0 until fitted)."""
        if self._fit is None:
            return 0.0
        a, b = self._fit
        return a + b * n


def _least_squares(samples: deque[tuple[int, float]]) -> tuple[float, float]:
    count = len(samples)
    mean_n = sum(n for n, _ in samples) / count
    mean_t = sum(t for _, t in samples) / count
    var_n = sum((n - mean_n) ** 2 for n, _ in samples)
    if var_n < 1e-9:
        # One size only: the split between fixed and per-item cost is unknowable; call half of it fixed.
        return mean_t / 2, mean_t / (2 * max(mean_n, 1.0))
    b = sum((n - mean_n) * (t - mean_t) for n, t in samples) / var_n
    b = max(b, 0.0)
    a = max(mean_t - b * mean_n, 0.0)
    if not (math.isfinite(a) and math.isfinite(b)):
        return mean_t, 0.0
    return a, b
