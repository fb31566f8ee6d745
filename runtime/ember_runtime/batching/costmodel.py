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
    """Recent ``(batch size, seconds)`` observations and the line through them.

    The fit comes from running sums of the window (updated as a sample enters and leaves), so that an observation
    costs the same whatever the window's length: an unbatched function observes once per call."""

    def __init__(self, window: int = 64, *, a: float | None = None, b: float | None = None) -> None:
        self._samples: deque[tuple[int, float]] = deque()
        self._window = window
        self._prior = (a, b) if a is not None and b is not None else None
        self._fit: tuple[float, float] | None = self._prior
        self._sums = _Sums()

    def observe(self, n: int, seconds: float) -> None:
        self._samples.append((n, seconds))
        self._sums.add(n, seconds)
        if len(self._samples) > self._window:
            self._sums.remove(*self._samples.popleft())
        if len(self._samples) >= MIN_SAMPLES:
            self._fit = self._sums.fit(self._samples)

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


class _Sums:
    """Σn, Σn² (integers: exact), Σt and Σn·t of the window. Float sums drift as samples come and go, so they are
    summed afresh from the window every ``_RESUM`` updates."""

    _RESUM = 1024

    def __init__(self) -> None:
        self.count = self.n = self.nn = 0
        self.t = self.nt = 0.0
        self._updates = 0

    def add(self, n: int, t: float) -> None:
        self.count += 1
        self.n += n
        self.nn += n * n
        self.t += t
        self.nt += n * t
        self._updates += 1

    def remove(self, n: int, t: float) -> None:
        self.count -= 1
        self.n -= n
        self.nn -= n * n
        self.t -= t
        self.nt -= n * t

    def fit(self, samples: deque[tuple[int, float]]) -> tuple[float, float]:
        if self._updates >= self._RESUM:
            self._updates = 0
            self.t = math.fsum(t for _, t in samples)
            self.nt = math.fsum(n * t for n, t in samples)
        count = self.count
        mean_n, mean_t = self.n / count, self.t / count
        var_n = self.nn - self.n * self.n / count
        if var_n < 1e-9:
            return mean_t / 2, mean_t / (2 * max(mean_n, 1.0))
        b = max((self.nt - self.n * mean_t) / var_n, 0.0)
        a = max(mean_t - b * mean_n, 0.0)
        if not (math.isfinite(a) and math.isfinite(b)):
            return mean_t, 0.0
        return a, b


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
