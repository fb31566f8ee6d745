"""``GET /healthz`` (the process is up) and ``GET /readyz`` (NATS connected, state loaded)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ember_platform.gateway.responses import json_response, platform_of


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})



async def readyz(request: Request) -> Response:
    platform = platform_of(request)
    if platform.ready():
        return json_response({"status": "ready"})
    return json_response({"status": "not ready", "nats_connected": platform.nc.is_connected}, 503)

