"""``GET /metrics``: the Prometheus text of ``ember_platform.metrics`` (``prometheus_client``), for the apps the
token sees.

Names follow Prometheus practice: an ``ember_`` prefix, base units (seconds, bytes), ``_total`` on counters, and
``app``/``function``/``version``/``replica`` labels (no per-call labels); the GPUs' figures use the names of
DCGM's and Triton's exporters (see ``ember_platform.metrics.gpu``).

The control plane's state is read on the event loop and the text rendered in a thread: the call path's series can
be many, and rendering them would hold every other request.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import EmberError
from ember_platform.gateway.guard import Endpoint, principal_of
from ember_platform.gateway.responses import platform_of
from ember_platform.metrics.llm import served_models
from ember_platform.metrics.scrape import CONTENT_TYPE, state_families, text


async def metrics(request: Request) -> Response:
    sees = principal_of(request).sees
    platform = platform_of(request)
    counted = platform.call_metrics
    counted.follow(platform.registry.deployments)
    deployments = platform.registry.deployments
    platform.llm_metrics.follow(deployments.generation, lambda: served_models(deployments.items))
    platform.schedules.metrics.follow(deployments.generation, lambda: deployments.items.keys())
    body = await asyncio.to_thread(text, platform, state_families(platform, sees), sees, counted.running)
    return Response(body, media_type=CONTENT_TYPE)


CALLED = "ember.called"  # where ``calls.invoke`` leaves (app, function, version) in the ASGI scope once it knows them


def metered(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` (the synchronous call's handler), counting each call it answers in the platform's
    ``CallMetrics``: by the function and version it named (``CALLED``), and the status code it answered with.

    ``EMBER_CALL_METRICS=off`` in the control plane's environment leaves ``endpoint`` as it is: no call is counted
    (``bench/metrics_cost.py`` measures what counting costs against it)."""
    if os.environ.get("EMBER_CALL_METRICS", "on").lower() in ("off", "0", "false"):
        return endpoint

    @functools.wraps(endpoint)
    async def counted(request: Request) -> Any:
        started = time.perf_counter()
        try:
            response = await endpoint(request)
        except EmberError as exc:
            _count(request, exc.http_status, started)
            raise
        except HTTPException as exc:
            _count(request, exc.status_code, started)
            raise
        _count(request, getattr(response, "status_code", 200), started)
        return response

    return counted


def _count(request: Request, code: int, started: float) -> None:
    app, function, version = request.scope.get(CALLED, _UNKNOWN)
    platform = platform_of(request)
    counted = platform.call_metrics
    counted.follow(platform.registry.deployments)  # the versions gone since the last call: their series dropped
    counted.record(app, function, version, code, time.perf_counter() - started)


_UNKNOWN = ("", "", 0)
