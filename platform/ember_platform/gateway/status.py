"""``GET /v1/status`` (``ember status``) and ``POST /v1/apps/<app>/scale`` (``ember scale``); the view itself is
built by ``ember_platform.control.status``."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import NotFoundError
from ember.wire import ScaleRequest, StatusView
from ember_platform.auth.scopes import Principal
from ember_platform.control.status import build_status, service_status
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of

_MAX_SCALE_BODY = 64 * 1024
_scale_decoder = msgspec.json.Decoder(ScaleRequest)


async def get_status(request: Request) -> Response:
    """``GET /v1/status[?app=&service=]``: nodes, their GPUs and replicas, and every service's state."""
    platform = platform_of(request)
    app, service = request.query_params.get("app") or None, request.query_params.get("service") or None
    control = platform.control
    holder = "" if control.lease is None else control.lease.holder if control.active else await control.lease.current()
    view = visible(build_status(control, control_plane=holder), principal_of(request))
    services = [s for s in view.services if app in (None, s.app) and service in (None, s.service)]
    if app is not None and not services:
        what = f"{app}.{service}" if service else app
        known = ", ".join(f"{s.app}.{s.service}" for s in view.services) or "none"
        raise NotFoundError(f"no service {what!r} is deployed (deployed: {known})")
    lacks = insecure(platform.settings.auth, platform.callout is not None)
    return json_response(msgspec.structs.replace(view, services=services, insecure=lacks))


def insecure(tokens_checked: bool, nats_credentials: bool) -> list[str]:
    """What this control plane was told to run without, in words (``ember status`` shows them first)."""
    found = []
    if not tokens_checked:
        found.append("no token is checked (--insecure-no-auth)")
    if not nats_credentials:
        found.append("NATS admits clients without credentials (no --nats-auth-dir)")
    return found



def visible(view: StatusView, principal: Principal) -> StatusView:
    """``view`` with only what concerns the apps ``principal`` sees: its services, and on each node its replicas,
    zygotes and warm starts (the nodes and their devices are shown to every reader)."""
    if principal.all_apps:
        return view
    nodes = []
    for node in view.nodes:
        replicas = [r for r in node.replicas if principal.sees(r.app)]
        ids = {r.replica_id for r in replicas}
        devices = [msgspec.structs.replace(d, replicas=[r for r in d.replicas if r in ids]) for d in node.devices]
        nodes.append(msgspec.structs.replace(node, replicas=replicas, devices=devices,
                                             zygotes=[z for z in node.zygotes if principal.sees(z.app)],
                                             warm_starts={a: s for a, s in node.warm_starts.items()
                                                          if principal.sees(a)}))
    return msgspec.structs.replace(view, nodes=nodes, services=[s for s in view.services if principal.sees(s.app)])


async def scale(request: Request) -> Response:
    """``POST /v1/apps/<app>/scale`` ``{"service", "min_replicas", "max_replicas"}`` → the service's status."""
    platform = platform_of(request)
    app = request.path_params["app"]
    platform.registry.view(app)  # 404 for an unknown app, before its name reaches a KV key
    req = decode_json(_scale_decoder, await read_body(request, _MAX_SCALE_BODY))
    dep = await platform.registry.set_scale(app, req.service, req.min_replicas, req.max_replicas)
    svc = next(s for s in dep.manifest.services if s.name == req.service)  # set_scale checked it is there
    control = platform.control
    return json_response(service_status(dep, svc, platform.registry.live_replicas(app, svc.name),
                                        control.services.get((app, svc.name)), control.pending,
                                        control.failures.get((app, svc.name), "")))

