"""Unassigned replicas are cut off: once the scheduler no longer assigns a replica to its node (the app was scaled
down, undeployed or rolled to another version) and its drain time has passed, every control plane kicks whatever
connections its NATS user still holds (``Kicker``): the replica's own, if it outlived its drain, and any that its
code opened with the same credentials. Their reconnects are refused by the auth callout (``_slot``), and a
connection's JWT expires anyway (``exp``, the replica credentials' TTL).

The sweep compares the assignments it saw at its last pass, and the replicas the callout admitted since, with the
current ones (``SWEEP_S``): a replica that left them is due ``grace_s`` later, unless it is assigned again before.
A replica unassigned while no control plane ran is not kicked; its JWT still expires within the TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.errors import Error as NatsError

from ember._loop import cancel_and_wait
from ember.wire import NodeAssignment
from ember.wire.jetstream import KVMirror
from ember.wire.natscreds import replica_user
from ember_platform.natsauth.clients import Kicker, sweep_every

log = logging.getLogger("ember.natsauth")
DRAIN_GRACE_S = 30.0  # the agent gives a stopping replica 25 s before it kills it


class UnassignedReplicas:
    """Kicks the connections of replicas unassigned ``grace_s`` ago, every ``SWEEP_S``."""

    def __init__(self, assignments: KVMirror[NodeAssignment], kicker: Kicker, grace_s: float = DRAIN_GRACE_S) -> None:
        self._assignments = assignments
        self._kicker = kicker
        self._grace_s = grace_s
        self._seen: set[str] = set()  # the replicas' NATS users assigned at the last sweep
        self._due: dict[str, float] = {}  # an unassigned replica's user: when its connections are kicked
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._seen = self._assigned()
        self._task = asyncio.create_task(sweep_every(self.sweep, "unassigned replicas"),
                                         name="unassigned-replicas-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def admitted(self, user: str) -> None:
        """A replica's user the auth callout just admitted: watched from now on, however short its assignment (one
        assigned and unassigned between two sweeps was never among the assignments a sweep saw, and kept its
        connections until its JWT expired)."""
        self._seen.add(user)

    def _assigned(self) -> set[str]:
        return {replica_user(node_id, slot.replica_id)
                for node_id, assignment in self._assignments.items.items() for slot in assignment.slots}

    async def sweep(self, now: float | None = None) -> int:
        """Note the replicas unassigned since the last sweep; kick those whose drain time has passed; how many
        connections were kicked."""
        now = time.monotonic() if now is None else now
        assigned = self._assigned()
        for user in self._seen - assigned:
            self._due.setdefault(user, now + self._grace_s)
        self._seen = assigned
        cut = 0
        for user, due in sorted(self._due.items()):
            if user in assigned:  # assigned again (the same replica id on the same node): its credentials hold
                del self._due[user]
                continue
            if due > now:
                continue
            try:
                kicked = await self._kicker.kick(user)
            except (NatsError, OSError, TimeoutError) as exc:
                log.warning("could not cut the connections of unassigned replica %s (%s: %s); trying again",
                            user, type(exc).__name__, exc)
                continue
            del self._due[user]
            if kicked:
                log.info("cut %d connections of unassigned replica %s", kicked, user)
            cut += kicked
        return cut
