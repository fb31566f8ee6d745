"""Where a replica reports its state."""

from __future__ import annotations

from typing import Any

from ember.wire import natsflush, subjects


class StatusRelay:
    """Where a replica reports its state: its own status subject, which its node agent writes to
    ``ember_replicas`` (a replica may write no bucket). The same two calls as the bucket's."""

    def __init__(self, nc: Any, replica_id: str) -> None:
        self._nc = nc
        self._subject = subjects.replica_status(replica_id)

    async def put(self, _key: str, value: bytes) -> None:
        await self._nc.publish(self._subject, value)
        await natsflush.flush(self._nc)

    async def delete(self, _key: str) -> None:
        """The replica is leaving: the agent removes its entry (an empty message)."""
        await self._nc.publish(self._subject, b"")
        await natsflush.flush(self._nc)
