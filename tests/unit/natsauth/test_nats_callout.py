"""The auth callout's decisions and the permissions it grants, without a server (the integration tests run the
real nats-server against it)."""

from __future__ import annotations

import nkeys
import pytest

from ember.wire import (
    Deployment,
    FunctionSpec,
    Manifest,
    NodeAssignment,
    ServiceSpec,
    SlotAssignment,
)
from ember.wire.natscreds import replica_credentials
from ember_platform.natsauth import jwt, keys, permissions
from ember_platform.natsauth.callout import AuthCallout, Refused


class _Mirror:
    def __init__(self, items: dict) -> None:
        self.items = items


def _slot(replica_id: str, app: str = "a") -> SlotAssignment:
    return SlotAssignment(replica_id=replica_id, app=app, service="svc", version=3, index=0)


def _callout(auth: keys.AuthKeys) -> AuthCallout:
    assignments = {"n1": NodeAssignment(node_id="n1", slots=[_slot("r1")], updated_at=0.0),
                   "n2": NodeAssignment(node_id="n2", slots=[_slot("r2", app="b")], updated_at=0.0)}
    fn = FunctionSpec(name="f", attr="f", input_mode="single", on=["orders.>"], result_subject="done")
    services = [ServiceSpec(name="svc", kind="function", functions=[fn])]
    deployments = {app: Deployment(app=app, version=3, bundle_sha256="0" * 64, created_at=0.0,
                                   manifest=Manifest(app=app, module="m", services=services)) for app in ("a", "b")}
    return AuthCallout(nc=None, keys=auth, assignments=_Mirror(assignments), deployments=_Mirror(deployments))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def auth() -> keys.AuthKeys:
    return keys.generate()


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def _allowed(perms: dict, kind: str, subject: str) -> bool:
    return any(_matches(p, subject) for p in perms[kind]["allow"])


def test_a_node_is_admitted_with_its_own_password_only(auth):
    callout = _callout(auth)
    node = auth.node_credentials("n1")
    name, perms = callout.authorize(node.user, node.password)
    assert name == "node.n1" and _allowed(perms, "pub", "$KV.ember_nodes.n1")
    assert not _allowed(perms, "pub", "$KV.ember_nodes.n2")
    with pytest.raises(Refused):
        callout.authorize("node.n1", auth.node_password("n2"))
    with pytest.raises(Refused):
        callout.authorize("node.n1", "")


def test_a_replica_is_admitted_only_while_assigned_to_the_node_that_vouches_for_it(auth):
    callout = _callout(auth)
    n1, n2 = auth.node_credentials("n1"), auth.node_credentials("n2")
    mine = replica_credentials(n1, "r1")
    _, perms = callout.authorize(mine.user, mine.password)
    assert _allowed(perms, "sub", "ember.invoke.default.a.f.v3")
    with pytest.raises(Refused, match="not assigned"):  # n1 may not speak for n2's replica
        other = replica_credentials(n1, "r2")
        callout.authorize(other.user, other.password)
    with pytest.raises(Refused, match="wrong password"):  # n2's replica under n1's name
        stolen = replica_credentials(n2, "r2")
        callout.authorize(mine.user.replace("r1", "r2"), stolen.password)
    with pytest.raises(Refused, match="not assigned"):
        gone = replica_credentials(n1, "r9")
        callout.authorize(gone.user, gone.password)


@pytest.mark.parametrize("user", ["", "admin", "node.", "node.bad.name.x", "replica.n1", "x" * 300])
def test_anyone_else_is_refused(auth, user):
    with pytest.raises(Refused):
        _callout(auth).authorize(user, "whatever")


def test_a_replicas_permissions_stay_within_its_app_and_its_own_subjects():
    perms = permissions.replica("r1", "a", 3, [("f", True, "done")])
    for subject in ["ember.invoke.default.a.f.v3", "ember.replica.r1.invoke", "ember.replica.r1.cancel",
                    "_INBOX.r1.abc"]:
        assert _allowed(perms, "sub", subject), subject
    for subject in ["ember.invoke.default.b.f.v3", "ember.invoke.default.a.g.v3", "ember.replica.r2.invoke",
                    "ember.>", "ember.logs.a.svc", "_INBOX.r2.abc", "$KV.ember_tokens.x", "_EMBER.answers.gw.a.f"]:
        assert not _allowed(perms, "sub", subject), subject
    for subject in ["_EMBER.answers.gw.a.f1", "ember.stats.a.f", "ember.replica.r1.status", "done",
                    "_EMBER.replies.a.x", "$JS.ACK.EMBER_CALLS.a--f.1.2.3.4.5",
                    "$JS.API.CONSUMER.MSG.NEXT.EMBER_EV_a_f.a--f", "$KV.ember_calls.r.a.abc", "$KV.ember_calls.s.a.abc",
                    "$KV.ember_results.a.abc.w.0"]:
        assert _allowed(perms, "pub", subject), subject
    for subject in ["_EMBER.answers.gw.b.f1",
                    # no read of any store, its own keys included: a read is answered where its request says
                    "$JS.API.DIRECT.GET.KV_ember_calls.$KV.ember_calls.r.a.abc",
                    "ember.stats.b.f", "ember.replica.r2.status", "ember.logs.a.svc",
                    "$KV.ember_replicas.r1", "$KV.ember_assignments.n1", "$KV.ember_deployments.a",
                    "$JS.API.STREAM.PURGE.EMBER_CALLS", "$JS.API.CONSUMER.CREATE.KV_ember_tokens",
                    "$JS.API.DIRECT.GET.KV_ember_tokens.x", "ember.calls.default.b.f", "elsewhere",
                    # another app's calls, and the streams' indexes, by any door
                    "_INBOX.x.y", "_EMBER.replies.b.x", "$KV.ember_calls.r.b.abc", "$KV.ember_calls.s.b.abc",
                    "$KV.ember_calls.k.a.abc", "$JS.API.DIRECT.GET.KV_ember_calls.$KV.ember_calls.r.b.abc",
                    "$JS.API.DIRECT.GET.KV_ember_calls", "$JS.API.STREAM.MSG.GET.KV_ember_calls",
                    "$JS.API.STREAM.INFO.KV_ember_calls", "$JS.API.STREAM.NAMES", "$KV.ember_results.b.abc.w.0",
                    "$JS.API.STREAM.MSG.GET.KV_ember_results", "$JS.API.STREAM.MSG.DELETE.EMBER_DEAD",
                    "$JS.API.STREAM.INFO.OBJ_ember_volume_chunks"]:
        assert not _allowed(perms, "pub", subject), subject
    assert perms["resp"] == {"max": 1, "ttl": 120_000_000_000}  # it answers the requests it receives, once each
    # calls spawned pinned to a version: the replica pulls its own version's queue, never another's
    assert _allowed(perms, "pub", "$JS.API.CONSUMER.MSG.NEXT.EMBER_CALLS.a--f--3")
    assert _allowed(perms, "pub", "$JS.ACK.EMBER_CALLS.a--f--3.1.2.3.4.5")
    for subject in ["$JS.API.CONSUMER.MSG.NEXT.EMBER_CALLS.a--f--2", "$JS.ACK.EMBER_CALLS.a--f--4.1.2.3.4.5",
                    "$JS.API.CONSUMER.MSG.NEXT.EMBER_CALLS.b--f--3"]:
        assert not _allowed(perms, "pub", subject), subject


def test_jwts_are_signed_and_checked():
    signer = jwt.new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    token = jwt.encode({"sub": "x", "nats": {"type": "user"}}, signer)
    assert jwt.decode(token)["iss"] == signer.public_key.decode()
    header, _, sig = token.split(".")
    other = jwt.encode({"sub": "y", "nats": {"type": "user"}}, signer).split(".")[1]
    with pytest.raises(jwt.JwtError):
        jwt.decode(f"{header}.{other}.{sig}")  # a body that was not signed
    with pytest.raises(jwt.JwtError):
        jwt.decode("not.a.jwt")


def test_only_a_node_asks_for_secrets_and_only_for_its_own_node(auth):
    callout = _callout(auth)
    node = auth.node_credentials("n1")
    _, perms = callout.authorize(node.user, node.password)
    assert _allowed(perms, "pub", "ember.node.n1.secrets")
    assert not _allowed(perms, "pub", "ember.node.n2.secrets")
    assert not _allowed(perms, "pub", "$JS.API.DIRECT.GET.KV_ember_secrets.hf")
    replica = replica_credentials(node, "r1")
    _, perms = callout.authorize(replica.user, replica.password)
    assert not _allowed(perms, "pub", "ember.node.n1.secrets")
    assert not _allowed(perms, "pub", "$JS.API.DIRECT.GET.KV_ember_secrets.hf")
    assert not _allowed(perms, "pub", "$JS.API.CONSUMER.CREATE.KV_ember_secrets")
