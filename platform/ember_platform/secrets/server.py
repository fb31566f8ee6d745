"""Delivery: node agents ask for the secrets of a replica they start, on ``ember.node.<node id>.secrets`` (only
that node's agent may publish there: its NATS permissions); every control plane answers from one queue group.

The answer holds the values only if the scheduler assigned that replica to that node, its service declares the
secrets and each secret's app patterns match the replica's app at that moment (an admin who narrows a secret stops
new replicas of other apps from getting it); otherwise an error the agent shows on the replica's status, retrying
with backoff.
"""

from __future__ import annotations

import contextlib
import logging

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from ember._errors import EmberError
from ember.wire import (
    Deployment,
    NodeAssignment,
    SlotAssignment,
    assignment_decoder,
    deployment_decoder,
    encoder,
    subjects,
)
from ember.wire.secrets import SecretsAnswer, SecretsRequest
from ember_platform.secrets.store import SecretStore

log = logging.getLogger("ember.secrets")
QUEUE = "ember-secrets"
_request = msgspec.json.Decoder(SecretsRequest)


class Refused(Exception):
    """Why a node's request is not answered with values."""


class SecretsServer:
    def __init__(self, nc: Client, store: SecretStore, assignments: KeyValue, deployments: KeyValue) -> None:
        self._nc = nc
        self._store = store
        self._assignments = assignments
        self._deployments = deployments
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(subjects.NODE_SECRETS_ALL, queue=QUEUE,
                                             cb=subjects.only_on(subjects.NODE_SECRETS_ALL, self._on_request))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _on_request(self, msg: Msg) -> None:
        if not msg.reply:
            return
        node_id = msg.subject.split(".")[2]
        try:
            request = _request.decode(msg.data)
            env = await self.answer(node_id, request.replica_id)
            answer = SecretsAnswer(env=env)
        except (Refused, EmberError, msgspec.DecodeError) as exc:
            log.warning("secrets refused to node %s: %s", node_id[:80], exc)
            answer = SecretsAnswer(error=str(exc))
        with contextlib.suppress(Exception):
            await msg.respond(encoder.encode(answer))

    async def answer(self, node_id: str, replica_id: str) -> dict[str, str]:
        """The env of ``replica_id``'s secrets, if it is assigned to ``node_id`` and its app may use them; else
        ``Refused`` or an ``EmberError``."""
        slot = await self._slot(node_id, replica_id)
        deployment = await self._deployment(slot.app)
        deployment = deployment.at(slot.version) or deployment  # a version still serving beside a newer one
        for service in deployment.manifest.services:
            if service.name == slot.service:
                if slot.version != deployment.version:
                    log.info("replica %s of %s v%d gets the secrets of v%d's service", replica_id, slot.app,
                             slot.version, deployment.version)
                return await self._store.env_for(slot.app, service.secrets)
        raise Refused(f"app {slot.app} has no service {slot.service}")

    async def _slot(self, node_id: str, replica_id: str) -> SlotAssignment:
        assignment: NodeAssignment | None = None
        with contextlib.suppress(Exception):
            entry = await self._assignments.get(node_id)  # read fresh: this control plane's mirror may lag
            assignment = assignment_decoder.decode(entry.value) if entry.value else None
        for slot in assignment.slots if assignment else ():
            if slot.replica_id == replica_id:
                return slot
        raise Refused(f"replica {replica_id[:80]!r} is not assigned to node {node_id[:80]!r}")

    async def _deployment(self, app: str) -> Deployment:
        try:
            entry = await self._deployments.get(app)
            if entry.value:
                return deployment_decoder.decode(entry.value)
        except Exception:
            pass
        raise Refused(f"app {app} is not deployed")
