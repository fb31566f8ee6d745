"""The auth callout: nats-server asks the control plane about every client that is not the control plane.

The server publishes an authorization request (a JWT it signed) on ``$SYS.REQ.USER.AUTH``; every control plane
answers from a queue group, so a standby answers as well as the active one. The answer is a JWT signed with the
callout key the servers trust, carrying the user's permissions, or an error (the client is refused).

- ``node.<node id>`` with the password derived for that node: a node agent (``permissions.node``);
- ``replica.<node id>.<replica id>`` with the password its agent derived: a replica, if the scheduler assigned
  that replica to that node; its permissions are its app's and functions' (``permissions.replica``). A replica
  no longer assigned is refused, so stopping a replica revokes its credentials. Its user JWT expires
  ``replica_ttl_s`` after it connected (``exp``; ``EMBER_REPLICA_CREDENTIALS_TTL_S``, one hour by default): nats-py
  closes a client for good when its credentials expire, so the replica reconnects at half that
  (``ember_runtime.replica.renewal``) and is asked about again here, admitted only while still assigned. The
  connections of a replica unassigned for its drain time are kicked (``replicas``);
- an Ember token with the ``events`` scope (as the NATS token, or user ``token`` with the token as password): an
  outside producer or consumer of events (``clients``), cut off when the token is revoked;
- ``system.ember`` with the password derived for it: the control plane's own connection in the system account,
  which only kicks the connections of revoked tokens.

Anyone else, and an anonymous client, is refused.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ember.wire import Deployment, NodeAssignment, SlotAssignment
from ember.wire.jetstream import KVMirror
from ember.wire.natscreds import NODE_USER_PREFIX, REPLICA_TTL_S, REPLICA_USER_PREFIX, replica_password
from ember_platform.auth.tokens import TokenStore
from ember_platform.natsauth import clients, jwt, permissions
from ember_platform.natsauth.clients import Admission, EventClients, Kicker, Refused
from ember_platform.natsauth.keys import AuthKeys, node_inbox
from ember_platform.natsauth.replicas import DRAIN_GRACE_S, UnassignedReplicas

log = logging.getLogger("ember.natsauth")
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "ember-auth"
MAX_USER = 200
MAX_TOKEN = 300
__all__ = ["AuthCallout", "Refused"]


class AuthCallout:
    def __init__(self, nc: Client, keys: AuthKeys, assignments: KVMirror[NodeAssignment],
                 deployments: KVMirror[Deployment], tokens: TokenStore | None = None, *,
                 replica_ttl_s: float = REPLICA_TTL_S, drain_grace_s: float = DRAIN_GRACE_S) -> None:
        self._nc = nc
        self._keys = keys
        self._issuer = keys.issuer
        self._assignments = assignments
        self._deployments = deployments
        self.replica_ttl_s = replica_ttl_s
        servers = [u.geturl() for u in nc.servers] if nc is not None else []
        self._kicker = Kicker(keys, servers)
        self.clients = EventClients(keys, tokens, deployments, servers, kicker=self._kicker)
        self.unassigned = UnassignedReplicas(assignments, self._kicker, drain_grace_s)
        self._sub: Subscription | None = None

    async def start(self) -> None:
        await self._assignments.start()
        self._sub = await self._nc.subscribe(AUTH_SUBJECT, queue=QUEUE, cb=self._on_request)
        await self.clients.start()
        await self.unassigned.start()

    async def stop(self) -> None:
        await self.unassigned.stop()
        await self.clients.stop()
        await self._kicker.close()
        if self._sub is not None:
            await self._sub.unsubscribe()
        await self._assignments.stop()

    async def _on_request(self, msg: Msg) -> None:
        try:
            request = jwt.decode(msg.data.decode())
            nats = request["nats"]
            user_nkey, server_id = str(nats["user_nkey"]), str(nats["server_id"]["id"])
            if request.get("iss") != server_id:
                raise jwt.JwtError("an authorization request not signed by its server")
            opts = nats.get("connect_opts") or {}
        except (jwt.JwtError, KeyError, TypeError, UnicodeDecodeError) as exc:
            log.warning("ignored an authorization request that is not one: %s", exc)
            return
        claims: dict[str, Any] = {"sub": user_nkey, "aud": server_id}
        try:
            admitted = self.admit(opts)
            user: dict[str, Any] = {"sub": user_nkey, "aud": admitted.account, "name": admitted.name,
                                    "nats": admitted.nats}
            if admitted.expires is not None:
                user["exp"] = int(admitted.expires)
            claims["nats"] = {"jwt": jwt.encode(user, self._issuer), "type": "authorization_response", "version": 2}
        except Refused as exc:
            log.warning("refused NATS client %r: %s", _shown(opts), exc)
            claims["nats"] = {"error": str(exc), "type": "authorization_response", "version": 2}
        await msg.respond(jwt.encode(claims, self._issuer).encode())

    def admit(self, opts: dict[str, Any]) -> Admission:
        """What to answer for a client's CONNECT options, or ``Refused``."""
        token = clients.token_of(opts)
        if token is not None:
            if clients.token_as_user(opts):
                raise Refused("a token goes in the password of user 'token', or as the NATS token; never as the user "
                              "name, which the server writes in its log")
            if not token or len(token) > MAX_TOKEN:
                raise Refused("no token" if not token else "token too long")
            return self.clients.admit(token)
        user, password = str(opts.get("user") or ""), str(opts.get("pass") or "")
        if clients.is_system(self._keys, user, password):
            return Admission(name=user, nats=clients.system_permissions(), account=clients.SYSTEM_ACCOUNT)
        name, perms = self.authorize(user, password)
        expires = time.time() + self.replica_ttl_s if name.startswith(REPLICA_USER_PREFIX) else None
        return Admission(name=name, nats=perms, expires=expires)

    def authorize(self, user: str, password: str) -> tuple[str, dict[str, Any]]:
        """The user's name and permissions, or ``Refused``."""
        if not user or len(user) > MAX_USER:
            raise Refused("no credentials" if not user else "user name too long")
        if user.startswith(NODE_USER_PREFIX):
            node_id = user[len(NODE_USER_PREFIX):]
            self._check(password, self._node_password(node_id))
            return user, permissions.node(node_id, node_inbox(node_id))
        if user.startswith(REPLICA_USER_PREFIX):
            node_id, _, replica_id = user[len(REPLICA_USER_PREFIX):].partition(".")
            expected = replica_password(self._node_password(node_id), replica_id)
            self._check(password, expected)  # before anything is looked up: no probing of what is assigned
            slot = self._slot(node_id, replica_id)
            self.unassigned.admitted(user)
            return user, permissions.replica(replica_id, slot.app, slot.version, self._functions(slot))
        raise Refused("unknown user")

    def _node_password(self, node_id: str) -> str:
        try:
            return self._keys.node_password(node_id)
        except ValueError:
            raise Refused("not a node id") from None

    @staticmethod
    def _check(given: str, expected: str) -> None:
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Refused("wrong password")

    def _slot(self, node_id: str, replica_id: str) -> SlotAssignment:
        assignment = self._assignments.items.get(node_id)
        for slot in assignment.slots if assignment else ():
            if slot.replica_id == replica_id:
                return slot
        raise Refused(f"replica {replica_id} is not assigned to node {node_id}")

    def _functions(self, slot: SlotAssignment) -> list[tuple[str, bool, str | None]]:
        deployment = self._deployments.items.get(slot.app)
        if deployment is not None:  # a replica of another version still serving (a rollout) has that version's
            deployment = deployment.at(slot.version) or deployment
        services = deployment.manifest.services if deployment else []
        for service in services:
            if service.name == slot.service:
                return [(fn.name, bool(fn.on), fn.result_subject) for fn in service.functions]
        raise Refused(f"app {slot.app} has no service {slot.service}")


def _shown(opts: dict[str, Any]) -> str:
    """The user a refused client gave, for the log: never a token or a password."""
    if clients.token_of(opts) is not None:
        return "(an Ember token)"
    user = str(opts.get("user") or "")[:80]
    return (user if user.isprintable() else repr(user)) or "(anonymous)"
