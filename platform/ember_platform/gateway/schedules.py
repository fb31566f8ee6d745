"""Schedule routes: ``GET /v1/schedules`` (the scheduled functions of the apps the token sees) and
``POST /v1/apps/<app>/schedules/<fn>/{pause,resume,run}``. The state is ``ember_schedules`` in KV, written with
compare-and-set (``control.schedules``): any control plane answers, the one holding the lease fires the ticks."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, NotFoundError
from ember.wire.schedules import ScheduleRun
from ember.wire.validate import APP_NAME
from ember_platform.gateway.body import read_body
from ember_platform.gateway.calls import FUNCTION_NAME
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of

MAX_ACTION_BODY = 1024  # none is expected


async def list_schedules(request: Request) -> Response:
    """``GET /v1/schedules[?app=]``: only the apps the token sees (an app it does not see lists nothing)."""
    app = request.query_params.get("app")
    if app is not None and not APP_NAME.fullmatch(app):
        raise BadRequestError("app is an app's name (a-z, 0-9 and '-', at most 63)", field="app")
    views = await platform_of(request).schedules.views(principal_of(request).sees, app)
    return json_response(views)


def _target(request: Request) -> tuple[str, str]:
    app, name = request.path_params["app"], request.path_params["name"]
    if not APP_NAME.fullmatch(app):
        raise BadRequestError("app is an app's name (a-z, 0-9 and '-', at most 63)", field="app")
    if not FUNCTION_NAME.fullmatch(name):
        raise BadRequestError("name is a function's name (or Class.method)", field="name")
    return app, name


async def _set_paused(request: Request, paused: bool) -> Response:
    app, name = _target(request)
    await read_body(request, MAX_ACTION_BODY)
    schedules = platform_of(request).schedules
    await schedules.set_paused(app, name, paused)
    for view in await schedules.views(lambda a: a == app, app):
        if view.function == name:
            return json_response(view)
    raise NotFoundError(f"{app} has no scheduled function {name!r}", field="name")  # a version without it, meanwhile


async def pause(request: Request) -> Response:
    """``POST /v1/apps/<app>/schedules/<fn>/pause``: its ticks pass unrun until it is resumed."""
    return await _set_paused(request, True)


async def resume(request: Request) -> Response:
    """``POST /v1/apps/<app>/schedules/<fn>/resume``: it runs again from its next tick (what passed is not caught
    up)."""
    return await _set_paused(request, False)


async def run(request: Request) -> Response:
    """``POST /v1/apps/<app>/schedules/<fn>/run``: one run now, outside the schedule (202 with its call id)."""
    app, name = _target(request)
    await read_body(request, MAX_ACTION_BODY)
    platform = platform_of(request)
    platform.schedules.find(app, name)  # a 404 before the quotas count it
    held = platform.quotas.limiter.admit(app, principal_of(request).token_id)  # 429 over the app's quotas, as a spawn
    try:
        call_id = await platform.schedules.run_now(app, name)
    finally:
        if held is not None:
            held.release()
    return json_response(ScheduleRun(app=app, function=name, call_id=call_id), 202)
