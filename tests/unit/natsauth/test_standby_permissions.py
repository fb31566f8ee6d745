"""Who may put a warm replica on standby (``subjects.replica_standby``): a control plane alone. A replica hears
its own standby and no other's, and neither a replica (of any app) nor a node agent may publish one, so that no
tenant can stop another's replica from taking its queued calls."""

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


def test_a_replica_hears_its_own_standby_and_sends_none() -> None:
    user = permissions.replica("r-1", "shop", 3, [("M.which", True, None)])
    sub, pub = user["sub"]["allow"], user["pub"]["allow"]
    assert _allowed(sub, subjects.replica_standby("r-1"))
    assert not _allowed(sub, subjects.replica_standby("r-2"))
    for other in ("r-1", "r-2"):
        assert not _allowed(pub, subjects.replica_standby(other))


def test_a_node_agent_sends_no_standby() -> None:
    user = permissions.node("n-1", "_INBOX_n1")
    assert not _allowed(user["pub"]["allow"], subjects.replica_standby("r-1"))
