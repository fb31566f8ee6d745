"""A replica's NATS credentials expire (the ``exp`` of the JWT the auth callout issues, ``ttl_s`` after each
connect); the replica renews them by reconnecting at half that.

nats-py closes a client for good when the server says its authentication expired, so the replica must not let that
happen: ``force_reconnect`` drops the connection and connects again at once, the server asks the auth callout
anew, and the control plane issues a fresh JWT only while the scheduler still assigns this replica to its node.
Nothing in flight is lost: answers and other publishes made meanwhile wait in the client's pending buffer and go
out once reconnected, its subscriptions are made again, and a queued call whose ack did not arrive is redelivered
by JetStream. A replica that is draining renews no more: it is no longer assigned, so it would be refused; its
JWT outlives a normal drain (at least half the TTL), and past that the server ends the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from nats.aio.client import Client

log = logging.getLogger("ember.replica")


def renew_at_s(ttl_s: float) -> float:
    """How long after a (re)connect the replica renews: about half the TTL, leaving the rest for a slow reconnect;
    spread over 40-50 % so that replicas that connected together (after a NATS restart) do not all renew together."""
    return ttl_s * random.uniform(0.4, 0.5)


async def renew_until(nc: Client, ttl_s: float, stopping: asyncio.Event) -> None:
    """Reconnect ``nc`` every ``renew_at_s(ttl_s)`` until ``stopping`` is set (the replica drains). A reconnect of
    the client's own (a server restart) only makes the JWT fresher than this schedule assumes."""
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), renew_at_s(ttl_s))
        if stopping.is_set() or nc.is_closed:
            return
        log.debug("renewing the replica's NATS credentials (reconnecting)")
        await nc.force_reconnect()
