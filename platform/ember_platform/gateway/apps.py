"""App routes: bundles, deployments, listing, showing and deleting apps (their logs: ``gateway.logs``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._bundle import BundleTooLargeError, check_bundle
from ember._errors import BadRequestError, ForbiddenError, InvalidInputError, InvalidSpecError, PayloadTooLargeError
from ember.wire import DeployRequest, Manifest
from ember.wire.validate import check_manifest, is_app_name
from ember_platform.auth.scopes import ADMIN, INVOKE, Principal
from ember_platform.config import Settings
from ember_platform.control.builds import check_locked
from ember_platform.control.owners import patterns_of, upload_target
from ember_platform.events.subjects import check_bindings
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.patterns import schema_patterns
from ember_platform.gateway.responses import json_response, platform_of

_deploy_decoder = msgspec.json.Decoder(DeployRequest)
MAX_LOG_LINES = 5000


async def put_bundle(request: Request) -> Response:
    """``PUT /v1/bundles/<sha256>[?app=<app>]``: stored once whoever uploads it, recorded for the uploading token's
    app patterns (only the apps they match may deploy it; an admin's, for the app it names); ``created`` says whether
    it is new to those patterns."""
    platform = platform_of(request)
    sha = request.path_params["sha256"]
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise InvalidInputError("a bundle is addressed by its lowercase hex sha256", field="sha256")
    data = await read_body(request, platform.settings.max_bundle_bytes)
    await asyncio.to_thread(_check_bundle, data, platform.settings)  # decompressing headers: off the event loop
    principal = principal_of(request)
    app = request.query_params.get("app")
    target = upload_target(principal, app, app_problem(app) if app is not None else None, "app")
    created = await platform.registry.put_bundle(sha, data, patterns_of(principal, target))
    return json_response({"sha256": sha, "size": len(data), "created": created}, 201 if created else 200)



def app_problem(name: str) -> str | None:
    return None if is_app_name(name) else f"{name[:80]!r} is not an app name (1 to 63 lowercase letters, digits, '-')"


def _check_bundle(data: bytes, settings: Settings) -> None:
    """Only plain files and folders inside the bundle, within the count and unpacked-size limits: 422 or 413."""
    try:
        check_bundle(data, max_unpacked_bytes=settings.max_bundle_unpacked_bytes, max_files=settings.max_bundle_files)
    except BundleTooLargeError as exc:
        raise PayloadTooLargeError(exc.message, field="$body") from exc
    except InvalidSpecError as exc:
        raise InvalidInputError(exc.message, field="$body") from exc


def _check_patterns(manifest: Manifest) -> None:
    """Every pattern in the input schemas is one the gateway can match in linear time (see ``patterns``)."""
    for i, service in enumerate(manifest.services):
        for j, fn in enumerate(service.functions):
            at = f"$.manifest.services[{i}].functions[{j}].input_schema"
            for field, problem in schema_patterns(fn.input_schema, at):
                raise InvalidInputError(problem, field=field)


def _check_calls(principal: Principal, manifest: Manifest) -> None:
    """An app's code may call only the apps its pusher may invoke: 403 naming the first other app in
    ``App(calls=[...])`` that the token cannot (one it does not see is named too: the pusher wrote its name)."""
    for i, app in enumerate(manifest.calls):
        if app != manifest.app and not (principal.may(INVOKE) and principal.sees(app)):
            raise ForbiddenError(f"this app calls app {app[:80]!r} (App(calls=...)), which this token may not invoke; "
                                 "push with a token that holds 'invoke' on it", field=f"$.manifest.calls[{i}]")


def _check_body_limits(settings: Settings, manifest: Manifest) -> None:
    """A function's ``max_body_bytes`` within the platform's cap (``EMBER_MAX_BODY_CAP_BYTES``): 422 naming it."""
    for i, svc in enumerate(manifest.services):
        for j, fn in enumerate(svc.functions):
            if fn.max_body_bytes > settings.max_body_cap_bytes:
                raise InvalidInputError(
                    f"max_body_bytes={fn.max_body_bytes} of {fn.name} is over this platform's cap of "
                    f"{settings.max_body_cap_bytes} bytes (EMBER_MAX_BODY_CAP_BYTES)",
                    field=f"$.manifest.services[{i}].functions[{j}].max_body_bytes")


async def deploy(request: Request) -> Response:
    platform = platform_of(request)
    body = await read_body(request, platform.settings.max_deploy_bytes)  # a manifest and a sha, not a bundle
    req = decode_json(_deploy_decoder, body)
    _check_patterns(req.manifest)
    platform.secrets.check_declared(request.path_params["app"], req.manifest, admin=principal_of(request).may(ADMIN))
    _check_body_limits(platform.settings, req.manifest)
    _check_calls(principal_of(request), req.manifest)
    check_locked(req.manifest)
    check_manifest(req.manifest)  # before the volumes are looked up, so that a bad mount is named as such
    check_bindings(req.manifest, platform.subject_grants.all(), platform.registry.deployments.items)
    req = msgspec.structs.replace(req, manifest=platform.volumes.pin(req.manifest, principal_of(request).sees))
    dep = await platform.registry.deploy(request.path_params["app"], req, any_content=principal_of(request).all_apps)
    return json_response(dep, 201)



async def list_apps(request: Request) -> Response:
    """``GET /v1/apps``: the apps the token sees."""
    registry = platform_of(request).registry
    principal = principal_of(request)
    return json_response([registry.view(app) for app in sorted(registry.deployments.items) if principal.sees(app)])



async def get_app(request: Request) -> Response:
    return json_response(platform_of(request).registry.view(request.path_params["app"]))



async def delete_app(request: Request) -> Response:
    await platform_of(request).registry.delete(request.path_params["app"])
    return Response(status_code=204)



def log_window(query: Mapping[str, str]) -> tuple[float, int]:
    """``since`` (a timestamp, default 0) and ``limit`` (lines, 1 and up, default 200, at most ``MAX_LOG_LINES``)
    of a logs query; ``BadRequestError`` naming the field for anything else (nan, inf, negative, not a number)."""
    try:
        since = float(query.get("since", 0))
    except ValueError:
        since = math.nan
    if not 0 <= since < math.inf:
        raise BadRequestError("since is a timestamp: a finite number of seconds since the epoch, 0 or more",
                              field="since")
    raw = query.get("limit", "200")
    digits = raw.lstrip("0")  # ASCII digits only (no sign, no point, no '_'); a number of any length clamps
    if not (raw.isascii() and raw.isdigit() and digits):
        raise BadRequestError(f"limit is a whole number of lines from 1 (at most {MAX_LOG_LINES} are kept)",
                              field="limit")
    return since, MAX_LOG_LINES if len(digits) > len(str(MAX_LOG_LINES)) else min(int(digits), MAX_LOG_LINES)

