"""A replica's secrets, asked of a control plane at its start (``ember.node.<node id>.secrets``, answered by a
queue group of control planes), with backoff after a refusal. The values go only into the replica's
environment: never into a log line, a status or an argv."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ember.wire import SlotAssignment, encoder, subjects
from ember.wire.secrets import SecretsAnswer, SecretsRequest

BACKOFF_S = (2.0, 300.0)  # a replica whose secrets were refused asks again after 2, 4, ... 300 s
REQUEST_TIMEOUT_S = 10.0
_answer = msgspec.json.Decoder(SecretsAnswer)


class SecretsUnavailable(Exception):
    """Why a replica's secrets could not be had (shown on its status); ``waiting`` while it backs off."""

    def __init__(self, reason: str, waiting: bool = False) -> None:
        super().__init__(reason)
        self.waiting = waiting


class SecretsFetcher:
    def __init__(self, nc: Any, node_id: str) -> None:
        self._nc = nc
        self._subject = subjects.node_secrets(node_id)
        self._node_id = node_id
        self._failures: dict[str, tuple[int, float, str]] = {}  # replica id -> (failures in a row, next try, why)

    async def get(self, slot: SlotAssignment) -> dict[str, str]:
        """The replica's secrets as environment variables ({} if its service declares none)."""
        if not slot.secrets:
            return {}
        failures, next_try, reason = self._failures.get(slot.replica_id, (0, 0.0, ""))
        if time.monotonic() < next_try:
            raise SecretsUnavailable(reason, waiting=True)
        try:
            msg = await self._nc.request(self._subject, encoder.encode(SecretsRequest(replica_id=slot.replica_id)),
                                         timeout=REQUEST_TIMEOUT_S)
            answer = _answer.decode(msg.data)
            error = answer.error
        except Exception as exc:  # no control plane answered, or not in time
            error = f"no control plane answered ({type(exc).__name__})"
        if not error:
            self._failures.pop(slot.replica_id, None)
            return answer.env
        failures += 1
        delay = min(BACKOFF_S[0] * 2 ** (failures - 1), BACKOFF_S[1])
        reason = (f"cannot get the secrets of {slot.app}/{slot.service} on node {self._node_id}: {error[:300]}; "
                  f"attempt {failures}, next in {delay:.0f}s")
        self._failures[slot.replica_id] = (failures, time.monotonic() + delay, reason)
        raise SecretsUnavailable(reason)

    def forget(self, replica_id: str) -> None:
        self._failures.pop(replica_id, None)
