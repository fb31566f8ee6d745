"""Per-function batching metrics of a replica, reported in its heartbeat and published by the platform."""

from __future__ import annotations

import bisect
import time

from ember.wire import FunctionStats, Histogram

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Hist:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> Histogram:
        return Histogram(bounds=list(self.bounds), counts=list(self.counts), sum=self.total, count=self.count)


class BatcherMetrics:
    def __init__(self) -> None:
        self.calls = 0
        self.batches = 0
        self.first_batch_at: float | None = None
        self.expired = 0
        self.rejected = 0
        self.cancelled = 0
        self.failed = 0
        self.fill_sum = 0.0
        self.batch_size = _Hist(SIZE_BUCKETS)
        self.queue_wait = _Hist(SECONDS_BUCKETS)
        self.run_time = _Hist(SECONDS_BUCKETS)

    def observe_batch(self, size: int, max_size: int, run_s: float, waits: list[float]) -> None:
        if not self.batches:
            self.first_batch_at = time.time()
        self.batches += 1
        self.calls += size
        self.fill_sum += size / max_size
        self.batch_size.observe(size)
        self.run_time.observe(run_s)
        for wait in waits:
            self.queue_wait.observe(max(wait, 0.0))

    def snapshot(self, function: str, queued: int, in_flight: int = 0, sequences: int | None = None) -> FunctionStats:
        return FunctionStats(function=function, calls=self.calls, batches=self.batches, expired=self.expired,
                             rejected=self.rejected, cancelled=self.cancelled, failed=self.failed,
                             queue_depth=queued, fill_ratio=self.fill_sum / self.batches if self.batches else 0.0,
                             batch_size=self.batch_size.snapshot(), queue_wait_s=self.queue_wait.snapshot(),
                             run_s=self.run_time.snapshot(), in_flight=in_flight,
                             sequences=sequences)
