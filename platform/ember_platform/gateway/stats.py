"""``GET /v1/stats``: each function's recent call rate, error share, p50 and p99, for the apps the token sees
(the web console polls it; see ``ember_platform.metrics.traffic``).

The snapshot of the counters is taken in a thread: they can be many, and summing them would hold the event loop."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response

from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of


async def get_stats(request: Request) -> Response:
    platform = platform_of(request)
    metrics = platform.call_metrics
    metrics.follow(platform.registry.deployments)
    now = time.time()
    await asyncio.to_thread(metrics.history.update, now, metrics.totals)
    return json_response(metrics.history.view(now, principal_of(request).sees))
