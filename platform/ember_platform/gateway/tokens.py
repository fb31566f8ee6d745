"""Token routes: ``POST /v1/tokens`` (the token, shown once), ``GET /v1/tokens``, ``DELETE /v1/tokens/<id>`` (admin)
and ``GET /v1/tokens/self`` (any token: what it may do; ``ember login`` checks a token with it)."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError
from ember.wire import TokenInfo, TokenRequest
from ember.wire.tokens import TOKEN_ID
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of

_MAX_TOKEN_BODY = 64 * 1024
_request_decoder = msgspec.json.Decoder(TokenRequest)


async def create_token(request: Request) -> Response:
    platform = platform_of(request)
    req = decode_json(_request_decoder, await read_body(request, _MAX_TOKEN_BODY))
    return json_response(await platform.tokens.create(req, principal_of(request)), 201)


async def list_tokens(request: Request) -> Response:
    return json_response(platform_of(request).tokens.live())


async def revoke_token(request: Request) -> Response:
    token_id = request.path_params["token_id"]
    if not TOKEN_ID.fullmatch(token_id):
        shown = token_id if len(token_id) <= 40 else token_id[:40] + "..."
        raise BadRequestError(f"{shown!r} is not a token id (1 to 32 lowercase letters and digits)", field="token_id")
    return json_response(await platform_of(request).tokens.revoke(token_id, principal_of(request)))


async def own_token(request: Request) -> Response:
    principal = principal_of(request)
    tokens = platform_of(request).tokens
    if not tokens.enabled:  # --insecure-no-auth: every request may do everything
        return json_response(TokenInfo(id="", name="authentication disabled", scopes=["admin"], apps=["*"],
                                       created_at=0.0))
    return json_response(tokens.info(principal.token_id))
