"""``GET /v1/stats``: each function's recent call rate, error share, p50 and p99, for the apps the token sees
(the web console polls it; see ``ember_platform.metrics.traffic``)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of


async def get_stats(request: Request) -> Response:
    metrics = platform_of(request).call_metrics
    now = time.time()
    metrics.history.update(now, metrics.totals)
    return json_response(metrics.history.view(now, principal_of(request).sees))
