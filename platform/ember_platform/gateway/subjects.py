"""Subject grant routes (admin): ``GET /v1/subjects``, ``POST /v1/subjects/grant`` and ``POST /v1/subjects/revoke``;
what an app may bind is ``ember_platform.events``."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember.wire.grants import SubjectGrantRequest
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of

_MAX_GRANT_BODY = 64 * 1024
_request_decoder = msgspec.json.Decoder(SubjectGrantRequest)


async def list_grants(request: Request) -> Response:
    return json_response(platform_of(request).subject_grants.all())


async def grant(request: Request) -> Response:
    req = decode_json(_request_decoder, await read_body(request, _MAX_GRANT_BODY))
    return json_response(await platform_of(request).subject_grants.grant(req, principal_of(request).token_id))


async def revoke(request: Request) -> Response:
    """The grant that is left (``null`` once no app is left)."""
    req = decode_json(_request_decoder, await read_body(request, _MAX_GRANT_BODY))
    return json_response(await platform_of(request).subject_grants.revoke(req, principal_of(request).token_id))
