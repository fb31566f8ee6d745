"""A replica's NATS credentials expire: the JWT the auth callout issues for it carries an ``exp`` of now plus the
configured TTL (and those of nodes none), and the connections of a replica unassigned for its drain time are kicked.
The integration tests (tests/integration/test_replica_credentials.py) run the real nats-server against both."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nkeys
import pytest

from ember.wire import Deployment, FunctionSpec, Manifest, NodeAssignment, ServiceSpec, SlotAssignment
from ember.wire.natscreds import REPLICA_TTL_ENV, replica_credentials, replica_ttl_s
from ember_platform.natsauth import jwt, keys
from ember_platform.natsauth.callout import AuthCallout
from ember_platform.natsauth.replicas import UnassignedReplicas


class _Mirror:
    def __init__(self, items: dict) -> None:
        self.items = items


def _callout(auth: keys.AuthKeys) -> AuthCallout:
    """A callout that knows of replica r1 of app a, assigned to node n1."""
    slot = SlotAssignment(replica_id="r1", app="a", service="svc", version=3, index=0)
    services = [ServiceSpec(name="svc", kind="function", functions=[FunctionSpec(name="f", attr="f",
                                                                                 input_mode="single")])]
    deployment = Deployment(app="a", version=3, bundle_sha256="0" * 64, created_at=0.0,
                            manifest=Manifest(app="a", module="m", services=services))
    return AuthCallout(nc=None, keys=auth,  # type: ignore[arg-type]
                       assignments=_Mirror({"n1": NodeAssignment(node_id="n1", slots=[slot], updated_at=0.0)}),
                       deployments=_Mirror({"a": deployment}))  # type: ignore[arg-type]


class _Request:
    """An authorization request as nats-server sends it: a JWT signed by the server, answered by ``respond``."""

    def __init__(self, user: str, password: str) -> None:
        server = jwt.new_key(nkeys.PREFIX_BYTE_SERVER)
        server_id = server.public_key.decode()
        claims = {"sub": server_id, "nats": {"user_nkey": "UABC", "server_id": {"id": server_id},
                                              "connect_opts": {"user": user, "pass": password}}}
        self.data = jwt.encode(claims, server).encode()
        self.answer: dict[str, Any] = {}

    async def respond(self, data: bytes) -> None:
        self.answer = jwt.decode(data.decode())


def _issued(callout: AuthCallout, user: str, password: str) -> dict[str, Any]:
    """The user JWT the callout issues for these credentials (decoded)."""
    request = _Request(user, password)
    asyncio.run(callout._on_request(request))  # type: ignore[arg-type]
    return jwt.decode(request.answer["nats"]["jwt"])


@pytest.fixture(scope="module")
def auth() -> keys.AuthKeys:
    return keys.generate()


def test_a_replicas_jwt_expires_after_the_ttl(auth):
    callout = _callout(auth)
    callout.replica_ttl_s = 120.0
    mine = replica_credentials(auth.node_credentials("n1"), "r1")
    before = time.time()
    user = _issued(callout, mine.user, mine.password)
    assert user["name"] == mine.user
    assert before + 119 <= user["exp"] <= time.time() + 120


def test_a_nodes_jwt_does_not_expire(auth):
    node = auth.node_credentials("n1")
    assert "exp" not in _issued(_callout(auth), node.user, node.password)


def test_the_agent_tells_a_replica_the_same_ttl(monkeypatch):
    monkeypatch.setenv(REPLICA_TTL_ENV, "3")
    assert replica_credentials(keys.generate().node_credentials("n1"), "r1").ttl_s == 3.0
    monkeypatch.setenv(REPLICA_TTL_ENV, "0")
    with pytest.raises(ValueError, match=REPLICA_TTL_ENV):
        replica_ttl_s()


class _Kicker:
    """Records whom it was asked to kick (the real one speaks to nats-server: see the integration tests)."""

    def __init__(self) -> None:
        self.kicked: list[str] = []

    async def kick(self, user: str) -> int:
        self.kicked.append(user)
        return 1


def test_an_unassigned_replica_is_kicked_once_its_drain_time_has_passed():
    slots = {"n1": NodeAssignment(node_id="n1", slots=[SlotAssignment(replica_id="r1", app="a", service="s",
                                                                       version=1, index=0)], updated_at=0.0)}
    mirror, kicker = _Mirror(dict(slots)), _Kicker()
    sweep = UnassignedReplicas(mirror, kicker, grace_s=10.0)  # type: ignore[arg-type]
    sweep._seen = sweep._assigned()

    async def run() -> None:
        assert await sweep.sweep(now=0.0) == 0
        mirror.items = {}  # scaled to zero
        assert await sweep.sweep(now=1.0) == 0 and kicker.kicked == []  # draining
        assert await sweep.sweep(now=11.5) == 1 and kicker.kicked == ["replica.n1.r1"]
        assert await sweep.sweep(now=30.0) == 0  # once

    asyncio.run(run())


def test_a_replica_assigned_again_before_its_drain_time_is_not_kicked():
    slot = SlotAssignment(replica_id="r1", app="a", service="s", version=1, index=0)
    mirror, kicker = _Mirror({"n1": NodeAssignment(node_id="n1", slots=[slot], updated_at=0.0)}), _Kicker()
    sweep = UnassignedReplicas(mirror, kicker, grace_s=10.0)  # type: ignore[arg-type]
    sweep._seen = sweep._assigned()
    kept = dict(mirror.items)

    async def run() -> None:
        mirror.items = {}
        await sweep.sweep(now=1.0)
        mirror.items = kept
        await sweep.sweep(now=2.0)
        assert await sweep.sweep(now=20.0) == 0 and kicker.kicked == []

    asyncio.run(run())


def test_a_replica_admitted_and_unassigned_between_two_sweeps_is_still_kicked(auth):
    """No sweep saw it assigned (it lived less than a sweep period): the callout's admission is what names it."""
    callout = _callout(auth)
    callout.unassigned._kicker = kicker = _Kicker()  # type: ignore[assignment]
    callout.unassigned._grace_s = 10.0
    mine = replica_credentials(auth.node_credentials("n1"), "r1")

    assigned = callout._assignments.items
    callout._assignments.items = {}

    async def run() -> None:
        assert await callout.unassigned.sweep(now=0.0) == 0  # the last sweep before it was assigned
        callout._assignments.items = assigned
        await callout._on_request(_Request(mine.user, mine.password))  # type: ignore[arg-type]
        callout._assignments.items = {}  # undeployed before the next sweep
        assert await callout.unassigned.sweep(now=1.0) == 0  # draining
        assert await callout.unassigned.sweep(now=11.5) == 1 and kicker.kicked == [mine.user]

    asyncio.run(run())
