"""A node's assignment read through a control plane while the assignments' store cannot answer (a timeout, a stream
leader's election): the read fails, and the node (told "unavailable") keeps what it runs. Read as "no
assignment", the node's next resync stopped every replica it had."""

from __future__ import annotations

import asyncio
import types

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KeyValue
from support.natsconn import connect as admin_connect

from ember.wire import assignment_decoder, subjects
from ember.wire.jetstream import kv_stream
from ember.wire.nodereads import FetchRequest
from ember_platform.control.node_reads import NodeReads

pytestmark = pytest.mark.integration


def test_an_assignment_the_store_cannot_read_now_is_not_read_as_none(platform, hello):
    async def scenario() -> None:
        nc = await admin_connect(platform.nats_url)
        try:
            bucket = subjects.ASSIGNMENTS_BUCKET
            stored = await (await nc.jetstream().key_value(bucket)).get(platform.node_id)
            kept = assignment_decoder.decode(stored.value)
            assert kept.slots  # the session's node runs replicas: read as none, it would stop them
            timing_out = KeyValue(name=bucket, stream=kv_stream(bucket), pre=f"$KV.{bucket}.",
                                  js=nc.jetstream(timeout=1e-6), direct=False)  # no answer comes in time
            reads = NodeReads(nc, types.SimpleNamespace(assignments=timing_out), lambda: {platform.node_id: kept})
            with pytest.raises(NatsTimeoutError):
                await reads.read(platform.node_id, FetchRequest(kind="assignment"))
        finally:
            await nc.close()

    asyncio.run(scenario())
