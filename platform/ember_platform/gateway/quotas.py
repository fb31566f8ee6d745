"""Quota routes (admin): ``PUT /v1/quotas/<name>``, ``GET /v1/quotas`` (with each quota's usage) and
``DELETE /v1/quotas/<name>``; the quotas themselves are ``ember_platform.quotas``."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import InvalidInputError
from ember.wire import QuotaRequest, QuotaUsage, QuotaView
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of
from ember_platform.quotas.caps import usage
from ember_platform.quotas.rules import check_name, check_request

_MAX_QUOTA_BODY = 64 * 1024
_request_decoder = msgspec.json.Decoder(QuotaRequest)


async def put_quota(request: Request) -> Response:
    platform = platform_of(request)
    name = check_name(request.path_params["quota"])
    req = decode_json(_request_decoder, await read_body(request, _MAX_QUOTA_BODY))
    check_request(name, req, now=0.0)  # every field first: 422 naming the one at fault
    tokens = platform.tokens
    if req.token is not None and tokens.enabled and req.token not in {t.id for t in tokens.live()}:
        raise InvalidInputError(f"no live token {req.token[:40]!r} (`ember token ls` lists them)", field="$.token")
    return json_response(await platform.quotas.put(name, req, principal_of(request).token_id))


async def list_quotas(request: Request) -> Response:
    platform = platform_of(request)
    control = platform.control
    slots = [s for a in control.assignments.items.values() for s in a.slots]
    totals = {d.uuid: d.memory_total_mb for n in control.nodes.items.values() for d in n.devices if d.uuid}
    views = []
    for quota in platform.quotas.all():
        replicas, memory = usage(quota, slots, totals)
        views.append(QuotaView(quota=quota, usage=QuotaUsage(
            replicas=replicas, gpu_memory_mb=memory, calls_in_flight=platform.quotas.limiter.in_flight(quota.name))))
    return json_response(views)


async def delete_quota(request: Request) -> Response:
    platform = platform_of(request)
    name = check_name(request.path_params["quota"])
    return json_response(await platform.quotas.delete(name, principal_of(request).token_id))
