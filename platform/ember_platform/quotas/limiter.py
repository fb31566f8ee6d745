"""Admitting calls against quotas: a token bucket per rate quota and a count of calls in flight per concurrency
quota, on an injected clock. Counted per control plane: each holds its own buckets and counts.

``Limiter.admit`` is on every call's path: with no quota that limits calls it is one dict check; otherwise the
quotas that apply to an (app, token) pair are found once and kept until the quotas change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ember._errors import RateLimitedError
from ember.wire.quotas import Quota
from ember_platform.quotas.rules import applies_to_call, limits_calls

MAX_KEPT_PAIRS = 10_000  # (app, token) pairs whose quotas are kept; beyond that the memo starts afresh


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; full at the start. A call takes one token."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, float(burst), float(burst), now

    def wait_s(self, now: float) -> float:
        """Seconds until a token is there (0: one is)."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1.0

    def reshape(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = min(self.tokens, self.burst)


class QuotaState:
    """One quota as this control plane counts it: its bucket (if it has a rate) and its calls in flight."""

    __slots__ = ("bucket", "in_flight", "quota")

    def __init__(self, quota: Quota, now: float) -> None:
        self.quota = quota
        self.in_flight = 0
        self.bucket = TokenBucket(quota.rate_per_s, quota.burst or 1, now) if quota.rate_per_s else None

    def update(self, quota: Quota, now: float) -> None:
        self.quota = quota
        if quota.rate_per_s is None:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = TokenBucket(quota.rate_per_s, quota.burst or 1, now)
        else:
            self.bucket.reshape(quota.rate_per_s, quota.burst or 1)

    def refusal(self, now: float) -> RateLimitedError | None:
        q = self.quota
        if q.max_concurrent_calls is not None and self.in_flight >= q.max_concurrent_calls:
            return RateLimitedError(f"quota {q.name!r}: {self.in_flight} calls in flight, at most "
                                    f"{q.max_concurrent_calls} (max_concurrent_calls, per control plane)",
                                    retry_after_s=1.0)
        wait = self.bucket.wait_s(now) if self.bucket is not None else 0.0
        if wait > 0:
            return RateLimitedError(f"quota {q.name!r}: over {q.rate_per_s:g} calls/s (burst {q.burst}, per "
                                    f"control plane); a call is allowed again in {wait:.3f} s", retry_after_s=wait)
        return None


class Held:
    """The calls-in-flight slots one admitted call holds; ``release`` (idempotent) gives them back."""

    __slots__ = ("states",)

    def __init__(self, states: tuple[QuotaState, ...]) -> None:
        self.states = states

    def release(self) -> None:
        for state in self.states:
            state.in_flight -= 1
        self.states = ()


class Limiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.states: dict[str, QuotaState] = {}  # only the quotas that limit calls
        self._pairs: dict[tuple[str, str], tuple[QuotaState, ...]] = {}

    def set(self, quotas: Iterable[Quota]) -> None:
        """The quotas now: a quota that stays keeps its calls in flight and what its bucket holds."""
        now = self.clock()
        states: dict[str, QuotaState] = {}
        for quota in quotas:
            if not limits_calls(quota):
                continue
            state = self.states.get(quota.name)
            if state is None:
                state = QuotaState(quota, now)
            else:  # the same object: calls admitted before hold it, and give their slots back to it
                state.update(quota, now)
            states[quota.name] = state
        self.states = states
        self._pairs = {}

    def admit(self, app: str, token_id: str) -> Held | None:
        """Admit a call of ``app`` made with ``token_id`` (""; none): ``RateLimitedError`` (429) when a quota that
        applies refuses it (then it takes nothing of any), else the slots it holds until ``release`` (None when no
        quota applies)."""
        if not self.states:
            return None
        key = (app, token_id)
        states = self._pairs.get(key)
        if states is None:
            if len(self._pairs) >= MAX_KEPT_PAIRS:
                self._pairs = {}
            states = self._pairs[key] = tuple(s for s in self.states.values()
                                              if applies_to_call(s.quota, app, token_id))
        if not states:
            return None
        now = self.clock()
        for state in states:
            refused = state.refusal(now)
            if refused is not None:
                raise refused
        for state in states:
            state.in_flight += 1
            if state.bucket is not None:
                state.bucket.take()
        return Held(states)

    def in_flight(self, name: str) -> int:
        state = self.states.get(name)
        return state.in_flight if state is not None else 0
