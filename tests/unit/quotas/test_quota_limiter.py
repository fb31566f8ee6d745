"""Admitting calls against quotas, on an injected clock: token buckets, calls in flight, which quotas apply."""

from __future__ import annotations

import pytest

from ember._errors import OverloadedError, RateLimitedError
from ember.wire import Quota
from ember_platform.quotas.limiter import Limiter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _limiter(*quotas: Quota) -> tuple[Limiter, Clock]:
    clock = Clock()
    limiter = Limiter(clock)
    limiter.set(quotas)
    return limiter, clock


def test_a_bucket_starts_full_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    for _ in range(3):
        assert bucket.wait_s(0.0) == 0.0
        bucket.take()
    assert bucket.wait_s(0.0) == pytest.approx(0.5)
    assert bucket.wait_s(0.25) == pytest.approx(0.25)
    assert bucket.wait_s(0.5) == 0.0
    assert bucket.wait_s(100.0) == 0.0 and bucket.tokens == 3.0  # never above its burst


def test_over_the_rate_is_a_429_with_the_wait_until_the_next_token() -> None:
    limiter, clock = _limiter(Quota(name="q", apps="team-a-*", rate_per_s=4.0, burst=2))
    for _ in range(2):
        held = limiter.admit("team-a-x", "")
        assert held is not None
        held.release()
    with pytest.raises(RateLimitedError) as refused:
        limiter.admit("team-a-y", "tok")  # the pattern's apps share the quota
    assert refused.value.retry_after_s == pytest.approx(0.25)
    assert refused.value.http_status == 429 and refused.value.code == "rate_limited"
    assert isinstance(refused.value, OverloadedError)
    clock.now += 0.25
    assert limiter.admit("team-a-x", "") is not None


def test_calls_in_flight_are_counted_until_released_and_a_refusal_takes_nothing() -> None:
    limiter, _ = _limiter(Quota(name="c", apps="a", max_concurrent_calls=2),
                          Quota(name="r", apps="a", rate_per_s=1.0, burst=10))
    first, second = limiter.admit("a", ""), limiter.admit("a", "")
    assert first is not None and second is not None
    assert limiter.in_flight("c") == limiter.in_flight("r") == 2
    with pytest.raises(RateLimitedError) as refused:
        limiter.admit("a", "")
    assert refused.value.retry_after_s == 1.0
    assert limiter.in_flight("r") == 2  # the refused call took no slot of the other quota
    assert limiter.states["r"].bucket is not None and limiter.states["r"].bucket.tokens == 8.0  # nor a token
    first.release()
    first.release()  # idempotent
    assert limiter.in_flight("c") == 1
    assert limiter.admit("a", "") is not None


def test_a_token_quota_applies_to_that_token_only() -> None:
    limiter, _ = _limiter(Quota(name="t", token="abc", max_concurrent_calls=0))
    assert limiter.admit("any", "other") is None
    assert limiter.admit("any", "") is None  # a public call carries no token
    with pytest.raises(RateLimitedError):
        limiter.admit("any", "abc")


def test_no_quota_on_calls_admits_without_a_hold() -> None:
    limiter, _ = _limiter(Quota(name="p", apps="*", max_replicas=3))  # a placement quota
    assert limiter.states == {}
    assert limiter.admit("a", "t") is None


def test_changing_a_quota_keeps_its_calls_in_flight_and_their_release() -> None:
    limiter, _ = _limiter(Quota(name="c", apps="a", max_concurrent_calls=1))
    held = limiter.admit("a", "")
    assert held is not None
    limiter.set([Quota(name="c", apps="a", max_concurrent_calls=1, rate_per_s=5.0)])
    with pytest.raises(RateLimitedError):
        limiter.admit("a", "")
    held.release()
    assert limiter.in_flight("c") == 0
    assert limiter.admit("a", "") is not None
    limiter.set([])
    assert limiter.admit("a", "") is None
