"""One active control loop among several control planes: a lease held in a NATS KV bucket.

Every control plane serves HTTP and routes calls; only the holder of the lease places, scales and writes
assignments, so that two control planes never write conflicting plans. The lease is one key written with
compare-and-set: ``create`` takes it when nobody holds it, ``update`` with the last revision renews it, and the
bucket's TTL removes the key of a holder that stopped renewing (a SIGKILLed process, a lost network), after
which another control plane's ``create`` succeeds. A holder that stops cleanly deletes the key at once.

Takeover is bounded by ``ttl_s`` plus one tick of the standby's loop. A holder that cannot renew (NATS is
unreachable, or another holder took over after a long pause) stops acting at once: it never writes assignments
unless its last successful renewal is younger than the TTL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ember.wire.jetstream import js_replicas

log = logging.getLogger("ember.control")

LEASES_BUCKET = "ember_leases"
CONTROL_KEY = "control"
LEASE_TTL_S = 6.0


def holder_id() -> str:
    """This process, recognisably: host, pid and a random part (a restarted process is another holder)."""
    return f"{socket.gethostname().split('.')[0]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Lease:
    def __init__(self, js: Any, holder: str | None = None, ttl_s: float = LEASE_TTL_S,
                 bucket: str = LEASES_BUCKET) -> None:
        self._js = js
        self._bucket_name = bucket
        self.holder = holder or holder_id()
        self._ttl_s = ttl_s
        self._kv: KeyValue | None = None
        self._revision: int | None = None  # of our own entry, while we hold the lease
        self._renewed_at = 0.0

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(self._bucket_name)
            except BucketNotFoundError:
                self._kv = await self._js.create_key_value(bucket=self._bucket_name, ttl=self._ttl_s, history=1,
                                                           replicas=js_replicas())
        return self._kv

    @property
    def held(self) -> bool:
        """True while our last successful renewal (from when it was sent: the bucket's TTL runs from when the
        server stored it, a little later) is younger than the TTL, less a margin for a write begun just before."""
        return self._revision is not None and time.monotonic() - self._renewed_at < self._ttl_s * 5 / 6

    async def hold(self) -> bool:
        """Take the lease, or renew it when a third of the TTL has passed; whether we hold it now."""
        if self.held and time.monotonic() - self._renewed_at < self._ttl_s / 3:
            return True
        try:
            kv = await self._bucket()
            sent = time.monotonic()
            if self._revision is not None:
                self._revision = await kv.update(CONTROL_KEY, self.holder.encode(), last=self._revision)
            else:
                self._revision = await kv.create(CONTROL_KEY, self.holder.encode())
                log.info("control plane %s holds the control lease", self.holder)
            self._renewed_at = sent
        except KeyWrongLastSequenceError:  # someone else holds it (or took it over from us)
            if self._revision is not None:
                log.warning("control plane %s lost the control lease", self.holder)
            self._revision = None
        except Exception as exc:  # NATS unreachable: we hold it only while our last renewal is fresh
            log.warning("cannot renew the control lease: %s", exc)
        return self.held

    async def current(self) -> str:
        """The holder of the lease as the bucket says ("" when nobody holds it)."""
        with contextlib.suppress(Exception):
            entry = await (await self._bucket()).get(CONTROL_KEY)
            return (entry.value or b"").decode()
        return ""

    async def release(self) -> None:
        """Give the lease up at once (a clean stop), so that another control plane takes over without waiting."""
        revision, self._revision = self._revision, None
        if revision is not None and self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(CONTROL_KEY, last=revision)
