"""The control plane's copy of ``ember_replicas``, which node agents write: each under its own node's keys
(``<node id>.<replica id>``, the only ones its NATS permissions allow), mirrored by replica id.

A node's permissions stop it writing another node's keys; what they cannot see is the body, and which replicas are a
node's at all. So a status counts only when it names the node and replica of its key and the scheduler assigned
that replica to that node (a replica that assignments no longer list, leaving, counts while the same node reports
it). A status that cannot be judged yet (the assignments not read yet, or not yet listing a replica just placed)
waits, and is judged again at each control loop tick (``recheck``): a node can neither report, revive nor remove a
replica of another node, nor invent one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from ember.wire import ReplicaStatus, replica_decoder
from ember.wire.jetstream import KVMirror

log = logging.getLogger("ember.registry")
MAX_WAITING = 10_000  # statuses waiting to be judged (then the oldest is dropped: its node writes again)


class ReplicaMirror(KVMirror[ReplicaStatus]):
    def __init__(self, kv: KeyValue, on_ready: Callable[[], None] = lambda: None) -> None:
        super().__init__(kv, replica_decoder.decode)
        self._on_ready = on_ready  # a replica's status turned "ready" (from another state, or its first)
        self._assigned: Callable[[str], str | None] | None = None  # replica id -> the node assignments list it on
        self._waiting: dict[str, tuple[ReplicaStatus, int]] = {}  # key -> a status not judged yet, its revision
        self._refused: set[str] = set()  # keys logged once

    def know_assignments(self, assigned_node: Callable[[str], str | None]) -> None:
        """From now on, judge statuses by ``assigned_node`` (the control loop's assignments), starting with those
        that waited."""
        self._assigned = assigned_node
        self.recheck()

    def recheck(self) -> None:
        """Judge again the statuses that waited for the assignments."""
        waiting, self._waiting = self._waiting, {}
        for key, (status, revision) in sorted(waiting.items(), key=lambda item: item[1][1]):
            self._judge(key, status, revision)

    def _apply(self, entry: KeyValue.Entry) -> None:
        node_id, _, replica_id = entry.key.partition(".")
        revision = entry.revision or 0
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
            self._waiting.pop(entry.key, None)
            held = self.items.get(replica_id)
            if held is not None and held.node_id == node_id:
                self.record(replica_id, None, revision)
                self.changed.set()
            return
        try:
            status = self._decode(entry.value)
        except Exception:
            log.warning("ignoring an undecodable replica status under %s", entry.key[:200])
            return
        if status.node_id != node_id or status.replica_id != replica_id:
            self._refuse(entry.key, "its key and its body name different replicas or nodes")
            return
        self._judge(entry.key, status, revision)

    def _judge(self, key: str, status: ReplicaStatus, revision: int) -> None:
        held = self.items.get(status.replica_id)
        assigned = self._assigned(status.replica_id) if self._assigned is not None else None
        if assigned == status.node_id or (assigned is None and held is not None and held.node_id == status.node_id):
            self.record(status.replica_id, status, revision)
            self.changed.set()
            if status.state == "ready" and (held is None or held.state != "ready"):
                self._on_ready()
        elif assigned is None:
            self._waiting.pop(key, None)
            self._waiting[key] = (status, revision)
            if len(self._waiting) > MAX_WAITING:
                self._waiting.pop(next(iter(self._waiting)))
        else:
            self._refuse(key, f"the scheduler assigned it to node {assigned}")

    def _refuse(self, key: str, why: str) -> None:
        if key not in self._refused and len(self._refused) < MAX_WAITING:
            self._refused.add(key)
            log.warning("ignoring the replica status under %s: %s", key[:200], why)
