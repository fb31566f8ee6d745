"""The control loop's view of the durable queues' backlog (``control.backlog``), against the platform's real
``EMBER_CALLS`` stream: every function's backlog from one stream info, whatever the number of deployed functions,
and only a function's own queue counted (not the calls pinned to one of its versions)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import pytest
from support.builders import deployment, service_spec
from support.natsconn import connect as admin_connect
from support.platform import TestPlatform

from ember.wire import subjects
from ember_platform.control.backlog import Backlog

pytestmark = pytest.mark.integration


class CountingJs:
    """The real JetStream context; counts the API requests the backlog makes through it."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.requests = 0

    async def stream_info(self, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return await self._js.stream_info(*args, **kwargs)

    async def consumer_info(self, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return await self._js.consumer_info(*args, **kwargs)


def _apps(count: int, tag: str) -> dict[str, Any]:
    deps = {}
    for i in range(count):
        dep = deployment(service_spec("f"))
        app = f"backlog-{tag}-{i}"
        deps[app] = msgspec.structs.replace(dep, app=app, manifest=msgspec.structs.replace(dep.manifest, app=app))
    return deps


def test_every_backlog_comes_from_one_request_and_pinned_calls_are_not_counted(platform: TestPlatform) -> None:
    tag = uuid.uuid4().hex[:8]
    busy = f"backlog-{tag}-0"

    async def run() -> tuple[dict[tuple[str, str], int], list[int]]:
        nc = await admin_connect(platform.nats_url)
        js = nc.jetstream()
        try:
            for _ in range(3):
                await js.publish(subjects.calls(busy, "f"), b"{}")
            await js.publish(subjects.pinned_calls(busy, "f", 1), b"{}")  # pinned: that version's, not a backlog
            counting = CountingJs(js)
            backlog = Backlog(counting)
            requests = []
            for count in (1, 300):
                before = counting.requests
                await backlog.refresh(_apps(count, tag))
                requests.append(counting.requests - before)
            return backlog.pending, requests
        finally:
            for subject in (subjects.calls(busy, "f"), subjects.pinned_calls(busy, "f", 1)):
                await js.purge_stream(subjects.CALLS_STREAM, subject=subject)
            await nc.close()

    pending, requests = asyncio.run(run())
    assert pending == {(busy, "f"): 3}
    assert requests == [1, 1]  # one stream info for one function as for three hundred


def test_a_backlog_of_an_app_no_longer_deployed_is_not_counted(platform: TestPlatform) -> None:
    tag = uuid.uuid4().hex[:8]
    gone = f"backlog-{tag}-0"

    async def run() -> dict[tuple[str, str], int]:
        nc = await admin_connect(platform.nats_url)
        js = nc.jetstream()
        try:
            await js.publish(subjects.calls(gone, "f"), b"{}")
            backlog = Backlog(js)
            await backlog.refresh(_apps(1, tag))
            assert backlog.pending == {(gone, "f"): 1}
            await backlog.refresh({})
            return backlog.pending
        finally:
            await js.purge_stream(subjects.CALLS_STREAM, subject=subjects.calls(gone, "f"))
            await nc.close()

    assert asyncio.run(run()) == {}
