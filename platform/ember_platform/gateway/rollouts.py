"""Rollout routes: ``POST /v1/apps/<app>/promote`` (the canary takes all traffic) and
``POST /v1/apps/<app>/rollback`` (an older version serves again). A push with ``canary_percent`` starts a canary
(``POST /v1/apps/<app>/deployments``, in ``apps``). The state is the app's deployment in JetStream KV, written
with compare-and-set, so that every control plane routes alike."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import InvalidInputError
from ember.wire import RolloutRequest
from ember_platform.control.rollout import MAX_VERSION
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.responses import json_response, platform_of

_decoder = msgspec.json.Decoder(RolloutRequest)
MAX_ROLLOUT_BODY = 1024


async def promote(request: Request) -> Response:
    """``POST /v1/apps/<app>/promote``: 409 when the app has no canary."""
    platform = platform_of(request)
    app = request.path_params["app"]
    platform.registry.view(app)  # 404 for an app that is not deployed (a name no app may have included)
    await read_body(request, MAX_ROLLOUT_BODY)  # none expected; a large one is still refused
    await platform.registry.promote(app)
    return json_response(platform.registry.view(app))


async def rollback(request: Request) -> Response:
    """``POST /v1/apps/<app>/rollback`` with ``{"version": N}`` (or nothing: the version before); 404 for a version
    the app does not keep (another app's versions are never its own), 409 when there is none before."""
    platform = platform_of(request)
    app = request.path_params["app"]
    platform.registry.view(app)  # 404 for an app that is not deployed (a name no app may have included)
    body = await read_body(request, MAX_ROLLOUT_BODY)
    req = decode_json(_decoder, body) if body.strip() else RolloutRequest()
    if isinstance(req.version, bool) or not 0 <= req.version <= MAX_VERSION:
        raise InvalidInputError(f"version is a whole number from 1 to {MAX_VERSION} (0 or none: the version "
                                "before)", field="$.version")
    await platform.registry.rollback(app, req.version)
    return json_response(platform.registry.view(app))
