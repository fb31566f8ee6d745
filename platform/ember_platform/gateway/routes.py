"""HTTP routes: invocation, deployment API and health."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ember._errors import BadRequestError, InvalidInputError
from ember._types import invalid_input
from ember.wire import (
    HTTP_BATCH_SIZE_HEADER,
    HTTP_CALL_ID_HEADER,
    HTTP_TIMEOUT_HEADER,
    DeployRequest,
    ReplayReply,
    encoder,
)
from ember_platform.gateway.body import header, read_body
from ember_platform.gateway.errors import error_response
from ember_platform.gateway.metrics import render as render_metrics
from ember_platform.platform import Platform

_deploy_decoder = msgspec.json.Decoder(DeployRequest)
T = TypeVar("T")


def _platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def _json(value: object, status: int = 200) -> Response:
    return Response(encoder.encode(value), status_code=status, media_type="application/json")


class JsonAnswer:
    """A 200 answer with a JSON body, its headers built by hand: on the hot path this skips the header
    handling of starlette's ``Response`` (an ASGI app all the same)."""

    __slots__ = ("body", "headers")

    def __init__(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.body = body
        self.headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json"), *headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


_CALL_ID = HTTP_CALL_ID_HEADER.lower().encode()
_BATCH_SIZE = HTTP_BATCH_SIZE_HEADER.lower().encode()
_TIMEOUT = HTTP_TIMEOUT_HEADER.lower().encode()


async def invoke(request: Request) -> Response | JsonAnswer:
    """``POST /v1/<app>/<name>``: validate, route to a replica, answer with its JSON result."""
    platform = _platform(request)
    app, name = request.path_params["app"], request.path_params["name"]
    dep, svc, fn, validator = platform.registry.resolve(app, name)
    timeout_s = _timeout(request, svc.timeout_s)
    body = validator.check(await read_body(request, platform.settings.max_body_bytes))
    call_id = os.urandom(16).hex()  # as random as uuid4().hex, at a fraction of its cost
    call = platform.router.call(app, fn.name, dep.version, body, call_id=call_id, deadline=time.time() + timeout_s)
    reply = await _unless_disconnected(request, call)
    if reply is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    if reply.error is not None:
        return error_response(msgspec.structs.replace(reply.error, call_id=call_id))
    return JsonAnswer(bytes(reply.output), [(_CALL_ID, call_id.encode()), (_BATCH_SIZE, b"%d" % reply.batch_size)])


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
    """``POST /v1/<app>/<name>/spawn``: validate, queue durably, answer 202 with the call id."""
    platform = _platform(request)
    app, name = request.path_params["app"], request.path_params["name"]
    _, _, fn, validator = platform.registry.resolve(app, name)
    raw_timeout = request.headers.get(HTTP_TIMEOUT_HEADER)
    deadline = time.time() + _timeout(request, float("inf")) if raw_timeout is not None else float("inf")
    body = validator.check(await read_body(request, platform.settings.max_body_bytes))
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= 256:
        raise BadRequestError("Idempotency-Key is 1 to 256 characters", field="Idempotency-Key")
    reply = await platform.calls.submit(app, fn.name, body, key=key, deadline=deadline)
    return _json(reply, 202)


async def get_call(request: Request) -> Response:
    platform = _platform(request)
    try:
        wait = float(request.query_params.get("wait", 0))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= 300:
        raise BadRequestError("wait is a number of seconds from 0 to 300", field="wait")
    return _json(await platform.calls.get(request.path_params["call_id"], wait))


async def cancel_call(request: Request) -> Response:
    return _json(await _platform(request).calls.cancel(request.path_params["call_id"]))


async def dead_letters(request: Request) -> Response:
    platform = _platform(request)
    app = request.path_params["app"]
    platform.registry.view(app)  # 404 for an unknown app
    function = request.query_params.get("function") or None
    return _json([letter for _, letter in await platform.calls.dead_letters(app, function)])


async def replay_dead(request: Request) -> Response:
    platform = _platform(request)
    app = request.path_params["app"]
    try:
        req = _replay_decoder.decode(await read_body(request, platform.settings.max_body_bytes))
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    platform.registry.resolve(app, req.function)  # 404 for an unknown function
    return _json(ReplayReply(replayed=await platform.calls.replay(app, req.function, req.call_ids)))


class _ReplayRequest(msgspec.Struct, forbid_unknown_fields=True):
    function: str
    call_ids: list[str] | None = None


_replay_decoder = msgspec.json.Decoder(_ReplayRequest)


def _timeout(request: Request, limit: float) -> float:
    raw = header(request, _TIMEOUT)
    if raw is None:
        return limit
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise BadRequestError(f"{HTTP_TIMEOUT_HEADER} must be a positive number of seconds", field=HTTP_TIMEOUT_HEADER)
    return min(value, limit)


async def put_bundle(request: Request) -> Response:
    platform = _platform(request)
    sha = request.path_params["sha256"]
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise InvalidInputError("a bundle is addressed by its lowercase hex sha256", field="sha256")
    data = await read_body(request, platform.settings.max_bundle_bytes)
    created = await platform.registry.put_bundle(sha, data)
    return _json({"sha256": sha, "size": len(data), "created": created}, 201 if created else 200)


async def deploy(request: Request) -> Response:
    platform = _platform(request)
    body = await read_body(request, platform.settings.max_bundle_bytes)
    try:
        req = _deploy_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    dep = await platform.registry.deploy(request.path_params["app"], req)
    return _json(dep, 201)


async def list_apps(request: Request) -> Response:
    registry = _platform(request).registry
    return _json([registry.view(app) for app in sorted(registry.deployments.items)])


async def get_app(request: Request) -> Response:
    return _json(_platform(request).registry.view(request.path_params["app"]))


async def delete_app(request: Request) -> Response:
    await _platform(request).registry.delete(request.path_params["app"])
    return Response(status_code=204)


async def app_logs(request: Request) -> Response:
    registry = _platform(request).registry
    app = request.path_params["app"]
    registry.view(app)  # 404 for an unknown app
    q = request.query_params
    try:
        since, limit = float(q.get("since", 0)), int(q.get("limit", 200))
    except ValueError as exc:
        raise BadRequestError("since is a timestamp and limit an integer") from exc
    service = q.get("service") or None
    return _json(registry.logs(app, service, since, max(1, min(limit, 5000))))


async def metrics(request: Request) -> Response:
    registry = _platform(request).registry
    replicas = [r for app in sorted(registry.deployments.items) for r in registry.live_replicas(app)]
    return Response(render_metrics(replicas), media_type="text/plain; version=0.0.4")


async def healthz(_request: Request) -> Response:
    return _json({"status": "ok"})


async def readyz(request: Request) -> Response:
    platform = _platform(request)
    if platform.ready():
        return _json({"status": "ready"})
    return _json({"status": "not ready", "nats_connected": platform.nc.is_connected}, 503)
