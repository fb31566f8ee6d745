"""Call routes: ``POST /v1/<app>/<fn>`` (synchronous, the hot path), ``.../spawn`` (queued), the records of
queued calls (``/v1/calls/<id>``) and dead letters (``/v1/apps/<app>/dead``)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, NotFoundError
from ember.wire import (
    HTTP_BATCH_SIZE_HEADER,
    HTTP_CALL_ID_HEADER,
    HTTP_TIMEOUT_HEADER,
    HTTP_VERSION_HEADER,
    MIN_TIMEOUT_S,
    RESERVED_APP_NAMES,
    CallRecord,
    Deployment,
    FunctionSpec,
    ReplayReply,
    ReplayRequest,
    ServiceSpec,
)
from ember_platform.auth.scopes import INVOKE
from ember_platform.calls.durable import DEAD_PAGE, MAX_DEAD_PAGE, check_call_id, no_such_call
from ember_platform.control import rollout
from ember_platform.gateway import binary, streaming
from ember_platform.gateway.body import InputValidator, decode_json, header, read_body
from ember_platform.gateway.errors import error_response
from ember_platform.gateway.guard import authorize, checks_itself, principal_of
from ember_platform.gateway.metrics import CALLED
from ember_platform.gateway.responses import JsonAnswer, json_response, platform_of
from ember_platform.platform import Platform

T = TypeVar("T")
_CALL_ID = HTTP_CALL_ID_HEADER.lower().encode()
_BATCH_SIZE = HTTP_BATCH_SIZE_HEADER.lower().encode()
_TIMEOUT = HTTP_TIMEOUT_HEADER.lower().encode()
_VERSION = HTTP_VERSION_HEADER.lower().encode()
_replay_decoder = msgspec.json.Decoder(ReplayRequest)
# A function's name: a Python identifier, or ``Class.method`` for a class model's method.
FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}(?:\.[A-Za-z_][A-Za-z0-9_]{0,127})?")


@checks_itself(INVOKE)
async def invoke(request: Request) -> Response | JsonAnswer | binary.BodyAnswer:
    """``POST /v1/<app>/<name>``: check the token (a ``public=True`` function needs none), validate, route to a
    replica, answer with its JSON result."""
    platform = platform_of(request)
    app, pinned = split_app(request.path_params["app"])
    name = request.path_params["name"]
    try:
        dep, svc, fn, validator = _function(platform, app, name, pinned)
    except NotFoundError:
        authorize(request, INVOKE, app)  # without a token, nobody learns which apps exist
        raise
    token_id = "" if fn.public else authorize(request, INVOKE, app).token_id
    request.scope[CALLED] = (app, fn.name, dep.version)  # what GET /metrics counts it under: a refused call, none
    timeout_s = _timeout(request, svc.timeout_s)
    formats = binary.negotiate(request, fn)  # None: JSON in and out
    raw = await binary.read_call_body(request, platform, app, fn)
    body, packed = (validator.check(raw), False) if formats is None else binary.prepare(validator, formats, raw)
    held = platform.quotas.limiter.admit(app, token_id)  # 429 over a quota; None when none applies (a dict check)
    call_id = os.urandom(16).hex()  # as random as uuid4().hex, at a fraction of its cost
    if fn.stream:  # a generator: its items as they come
        return await streaming.respond(request, platform, app, fn.name, dep.version, body, call_id=call_id,
                                       deadline=time.time() + timeout_s, packed=packed, held=held,
                                       watch=_unless_disconnected)
    try:
        call = platform.router.call(app, fn.name, dep.version, body, call_id=call_id,
                                    deadline=time.time() + timeout_s, packed=packed)
        reply = await _unless_disconnected(request, call)
    finally:
        if held is not None:  # however the call ended: answered, failed, timed out, client gone
            held.release()
    if reply is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    version = b"%d" % dep.version  # which version answered (a rollout or canary splits the calls)
    if reply.error is not None:
        response = error_response(msgspec.structs.replace(reply.error, call_id=call_id))
        response.headers[HTTP_VERSION_HEADER] = version.decode()
        return response
    headers = [(_CALL_ID, call_id.encode()), (_BATCH_SIZE, b"%d" % reply.batch_size), (_VERSION, version)]
    if formats is not None or packed:
        wanted = formats.answer if formats is not None else "json"
        return binary.BodyAnswer(binary.answer_body(reply.output, packed, wanted), wanted, headers)
    return JsonAnswer(bytes(reply.output), headers)



WATCH_AFTER_S = 0.02  # calls answered sooner never pay for a disconnect watcher



async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Await ``work``; cancel it (so that the replica drops the call) if the client disconnects first.

    ``work`` runs in the caller's task. A watcher task that cancels it on disconnect starts only once the
    call has taken ``WATCH_AFTER_S``: most calls are answered sooner, and on this hot path a task per call
    costs more than the call's own bookkeeping. A client that left earlier is noticed then."""
    this = asyncio.current_task()
    assert this is not None
    loop = asyncio.get_running_loop()
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        this.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        this.uncancel()
        return None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()



async def spawn(request: Request) -> Response:
    """``POST /v1/<app>[@<version>]/<name>/spawn``: validate, queue durably, answer 202 with the call id."""
    platform = platform_of(request)
    app, pinned = split_app(request.path_params["app"])
    name = request.path_params["name"]
    dep, _, fn, validator = _function(platform, app, name, pinned)
    request.scope[CALLED] = (app, fn.name, dep.version)  # what GET /metrics counts this submit under
    raw_timeout = request.headers.get(HTTP_TIMEOUT_HEADER)
    deadline = time.time() + _timeout(request, float("inf")) if raw_timeout is not None else float("inf")
    formats = binary.negotiate(request, fn)
    body = binary.to_json(validator, formats, await binary.read_call_body(request, platform, app, fn))
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= 256:
        raise BadRequestError("Idempotency-Key is 1 to 256 characters", field="Idempotency-Key")
    held = platform.quotas.limiter.admit(app, principal_of(request).token_id)  # rate; concurrency while submitting
    try:
        reply = await platform.calls.submit(app, fn.name, body, key=key, deadline=deadline,
                                            version=dep.version if pinned is not None else None)
    finally:
        if held is not None:
            held.release()
    return json_response(reply, 202)



async def get_call(request: Request) -> Response:
    """``GET /v1/calls/<id>[?wait=]``: the record of a call of an app the token may invoke (else 404, as for an
    unknown call)."""
    platform = platform_of(request)
    call_id = check_call_id(request.path_params["call_id"])
    try:
        wait = float(request.query_params.get("wait", 0))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= 300:
        raise BadRequestError("wait is a number of seconds from 0 to 300", field="wait")
    record = await _own_call(request, call_id)
    return json_response(await platform.calls.get(call_id, wait) if wait > 0 else record)



async def cancel_call(request: Request) -> Response:
    """``DELETE /v1/calls/<id>[?terminate=true]``: cancel a queued or running call (``Calls.cancel``); the record
    names the token that cancelled it."""
    call_id = check_call_id(request.path_params["call_id"])
    raw = request.query_params.get("terminate", "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise BadRequestError("terminate is true or false", field="terminate")
    await _own_call(request, call_id)
    return json_response(await platform_of(request).calls.cancel(
        call_id, by=principal_of(request).token_id or "a token", terminate=raw in ("true", "1")))


async def _own_call(request: Request, call_id: str) -> CallRecord:
    """The call's record, if the request's token sees its app; the 404 of an unknown call if not."""
    record = await platform_of(request).calls.get(call_id)
    if not principal_of(request).sees(record.app):
        raise no_such_call(call_id)
    return record



async def dead_letters(request: Request) -> Response:
    """``GET /v1/apps/<app>/dead[?function=&limit=&after=]``: a page of dead letters, oldest first (``limit``
    1 to 1000, 100 by default); the next page is ``after=`` the last letter's ``seq``."""
    platform = platform_of(request)
    app = request.path_params["app"]
    platform.registry.view(app)  # 404 for an unknown app
    function = request.query_params.get("function")  # given empty: a 400 naming it, as the document says
    if function is not None:
        platform.registry.resolve(app, check_function_name(function, "function"))  # 404 naming those that exist

    def whole(name: str, default: int, low: int, high: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise BadRequestError(f"{name} is a whole number from {low} to {high}", field=name)
        return value

    limit, after = whole("limit", DEAD_PAGE, 1, MAX_DEAD_PAGE), whole("after", 0, 0, 2**63)
    return json_response([letter for _, letter in await platform.calls.dead_letters(app, function, limit=limit,
                                                                                  after=after)])



async def replay_dead(request: Request) -> Response:
    platform = platform_of(request)
    app = request.path_params["app"]
    req = decode_json(_replay_decoder, await read_body(request, platform.settings.max_body_bytes))
    platform.registry.resolve(app, req.function)  # 404 for an unknown function
    token_id = principal_of(request).token_id
    replaying = platform.calls.replay(app, req.function, req.call_ids,
                                      admit=lambda: platform.quotas.limiter.admit(app, token_id))
    replayed = await _unless_disconnected(request, replaying)  # idempotent: a client gone stops it, none lost
    return Response(status_code=499) if replayed is None else json_response(ReplayReply(replayed=replayed))



def check_function_name(name: str, field: str) -> str:
    """``name`` if it can name a function (``f`` or ``Class.method``); ``BadRequestError`` naming ``field`` if not."""
    if not FUNCTION_NAME.fullmatch(name):
        shown = name if len(name) <= 80 else name[:80] + "..."
        raise BadRequestError(f"{shown!r} is not a function name (a Python identifier, or Class.method)", field=field)
    return name


def split_app(segment: str) -> tuple[str, int | None]:
    """``<app>`` or ``<app>@<version>`` (a call pinned to a version): the app and the version; a version that is
    not a whole number from 1 is a 422 naming ``version``."""
    app, at, raw = segment.partition("@")
    return app, rollout.parse_version(raw) if at else None


def _function(platform: Platform, app: str, name: str,
              pinned: int | None = None) -> tuple[Deployment, ServiceSpec, FunctionSpec, InputValidator]:
    """The function a call names (in the version it pins, else the one the traffic split draws) and its input
    validator. A first segment that names an API route (``POST /v1/apps/x``) is that route's, not an app's: 405,
    as the route table answers other methods."""
    if app in RESERVED_APP_NAMES:
        raise HTTPException(405)
    dep, svc, fn = platform.registry.route(app, name, pinned, random.random())
    return dep, svc, fn, platform.validators.of(dep, fn)


def _timeout(request: Request, limit: float) -> float:
    raw = header(request, _TIMEOUT)
    if raw is None:
        return limit
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not MIN_TIMEOUT_S <= value < float("inf"):
        raise BadRequestError(f"{HTTP_TIMEOUT_HEADER} must be a number of seconds, at least {MIN_TIMEOUT_S:g}",
                              field=HTTP_TIMEOUT_HEADER)
    return min(value, limit)

