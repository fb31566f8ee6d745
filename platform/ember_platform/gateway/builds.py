"""Build routes: ``POST /v1/apps/<app>/builds`` (lock and build an app's images, read its manifest inside them) and
``GET /v1/apps/<app>/builds/<id>?since=N`` (its state, its log from line N, its result). See ``control.builds``."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError
from ember.wire.builds import BuildStart
from ember.wire.images import BUILD_ID
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.responses import json_response, platform_of

_start = msgspec.json.Decoder(BuildStart)


async def start_build(request: Request) -> Response:
    platform = platform_of(request)
    body = await read_body(request, platform.settings.max_deploy_bytes)
    view = await platform.builds.start_build(request.path_params["app"], decode_json(_start, body))
    return json_response(view, 202)


async def get_build(request: Request) -> Response:
    build_id = request.path_params["build_id"]
    if not BUILD_ID.fullmatch(build_id):
        raise BadRequestError("a build id is 32 lowercase hex digits", field="build_id")
    raw = request.query_params.get("since", "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise BadRequestError("since is a line number: a whole number, 0 or more", field="since")
    return json_response(platform_of(request).builds.view(request.path_params["app"], build_id, int(raw)))
