"""App routes: bundles, deployments, listing, showing and deleting apps, and their replicas' logs."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, InvalidInputError
from ember.wire import DeployRequest
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.responses import json_response, platform_of

_deploy_decoder = msgspec.json.Decoder(DeployRequest)


async def put_bundle(request: Request) -> Response:
    platform = platform_of(request)
    sha = request.path_params["sha256"]
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise InvalidInputError("a bundle is addressed by its lowercase hex sha256", field="sha256")
    data = await read_body(request, platform.settings.max_bundle_bytes)
    created = await platform.registry.put_bundle(sha, data)
    return json_response({"sha256": sha, "size": len(data), "created": created}, 201 if created else 200)



async def deploy(request: Request) -> Response:
    platform = platform_of(request)
    body = await read_body(request, platform.settings.max_bundle_bytes)
    req = decode_json(_deploy_decoder, body)
    dep = await platform.registry.deploy(request.path_params["app"], req)
    return json_response(dep, 201)



async def list_apps(request: Request) -> Response:
    registry = platform_of(request).registry
    return json_response([registry.view(app) for app in sorted(registry.deployments.items)])



async def get_app(request: Request) -> Response:
    return json_response(platform_of(request).registry.view(request.path_params["app"]))



async def delete_app(request: Request) -> Response:
    await platform_of(request).registry.delete(request.path_params["app"])
    return Response(status_code=204)



async def app_logs(request: Request) -> Response:
    registry = platform_of(request).registry
    app = request.path_params["app"]
    registry.view(app)  # 404 for an unknown app
    q = request.query_params
    try:
        since, limit = float(q.get("since", 0)), int(q.get("limit", 200))
    except ValueError as exc:
        raise BadRequestError("since is a timestamp and limit an integer") from exc
    service = q.get("service") or None
    return json_response(registry.logs(app, service, since, max(1, min(limit, 5000))))

