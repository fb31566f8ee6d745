"""What a replica may do with streams on NATS: take its own credit and cancellations, answer its own app's
streams, and nothing of another replica's or app's."""

from __future__ import annotations

from ember.wire import subjects
from ember_platform.natsauth import permissions


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, a final ``>`` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def _allowed(allow: list[str], subject: str) -> bool:
    return any(_matches(pattern, subject) for pattern in allow)


def test_a_replica_takes_its_own_credit_and_cancellations_only():
    user = permissions.replica("r-1", "shop", 3, [("Streamer.count", False, None)])
    sub, pub = user["sub"]["allow"], user["pub"]["allow"]
    assert _allowed(sub, subjects.replica_credit("r-1")) and _allowed(sub, subjects.replica_cancel("r-1"))
    assert not _allowed(sub, subjects.replica_credit("r-2"))
    for other in ("r-1", "r-2"):  # credit and cancellations come from a control plane, never from a replica
        assert not _allowed(pub, subjects.replica_credit(other))
        assert not _allowed(pub, subjects.replica_cancel(other))


def test_a_replica_streams_only_to_its_own_apps_callers():
    user = permissions.replica("r-1", "shop", 3, [("Streamer.count", False, None)])
    pub = user["pub"]["allow"]
    inbox = subjects.answers_inbox("gw1")
    assert _allowed(pub, f"{inbox}.shop.0123abcd")  # a stream's reply subject: <inbox>.<app>.<token>
    assert not _allowed(pub, f"{inbox}.bank.0123abcd")
