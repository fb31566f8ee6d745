"""Secret routes (admin): ``PUT /v1/secrets/<name>`` (values and the app patterns that may use them), ``GET
/v1/secrets`` (names, keys, times and app patterns, never values) and ``DELETE /v1/secrets/<name>``; the secrets
themselves are ``ember_platform.secrets``."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import InvalidInputError
from ember.wire.secrets import MAX_SECRET_BYTES, SecretRequest
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of
from ember_platform.secrets.checks import check_apps, check_name

_MAX_SECRET_BODY = 2 * MAX_SECRET_BYTES + 16 * 1024  # JSON escapes; check_values counts the decoded bytes
_request_decoder = msgspec.json.Decoder(SecretRequest)


async def put_secret(request: Request) -> Response:
    platform = platform_of(request)
    name = check_name(request.path_params["secret"], field="secret")
    platform.secrets.require_key()  # before reading a body
    body = await read_body(request, _MAX_SECRET_BODY)
    try:
        req = decode_json(_request_decoder, body)
    except InvalidInputError as exc:
        if exc.field == "$.apps":  # none or empty: the message that says what to give
            check_apps(None)
        raise
    return json_response(await platform.secrets.put(name, req.values, req.apps, principal_of(request).token_id))


async def list_secrets(request: Request) -> Response:
    secrets = platform_of(request).secrets
    secrets.require_key()
    return json_response(secrets.views())


async def delete_secret(request: Request) -> Response:
    platform = platform_of(request)
    name = check_name(request.path_params["secret"], field="secret")
    platform.secrets.require_key()
    await platform.secrets.delete(name, principal_of(request).token_id)
    return Response(status_code=204)
