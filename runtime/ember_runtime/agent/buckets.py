"""The two JetStream buckets a node agent writes: its node's info and its replicas' states."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from nats import errors as nats_errors
from nats.js import errors as nats_js_errors
from nats.js.kv import KeyValue

from ember.wire import subjects
from ember.wire.jetstream import kv_stream, node_buckets

log = logging.getLogger("ember.agent")


@dataclasses.dataclass(frozen=True)
class NodeBuckets:
    nodes: KeyValue  # its node's info, under its node id
    replicas: KeyValue  # its replicas' states, under <node id>.<replica id>


async def open_buckets(nc: Any, stop: asyncio.Event) -> NodeBuckets | None:
    """The two buckets an agent writes (its node's info, its replicas' states), once the control plane has created
    them (an agent may start first; it may not create). It asks about these two streams alone: their keys (node and
    replica ids) are what it hears on ``REPLICA_STATUS_ALL`` anyway; every other store is closed to it. None: stopped,
    or the connection is closed."""
    js, said = nc.jetstream(), False
    while True:
        try:
            for bucket in (subjects.NODES_BUCKET, subjects.REPLICAS_BUCKET):
                await js.stream_info(kv_stream(bucket))
            nodes, replicas = node_buckets(js)
            return NodeBuckets(nodes=nodes, replicas=replicas)
        except (nats_js_errors.NotFoundError, nats_errors.TimeoutError,  # a cluster may still be creating
                nats_errors.ConnectionClosedError) as exc:
            if not said and not nc.is_closed:
                log.info("waiting for the control plane to create Ember's buckets (%s)", exc or type(exc).__name__)
                said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)  # also between connections, when the server closes each at once
        if nc.is_closed or stop.is_set():
            return None
