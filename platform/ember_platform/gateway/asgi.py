"""The starlette application: the route table, error handlers, and a lifespan that owns the process's state.

To add a route: write its handler in the module of its group (``calls``, ``apps``, ``status``, ``metrics``,
``health``), add it to ``ROUTES`` here, and give it a test that sends it hostile input.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ember._errors import EmberError
from ember.wire import RESERVED_APP_NAMES
from ember_platform.config import Settings
from ember_platform.gateway import apps, calls, health, metrics, openapi, status
from ember_platform.gateway.errors import ember_error_handler, ember_error_response, http_error_handler
from ember_platform.platform import Platform

ROUTES = [
    Route("/healthz", health.healthz, methods=["GET"]),
    Route("/readyz", health.readyz, methods=["GET"]),
    Route("/metrics", metrics.metrics, methods=["GET"]),
    Route("/openapi.json", openapi.document, methods=["GET"]),
    Route("/v1/bundles/{sha256}", apps.put_bundle, methods=["PUT"]),
    Route("/v1/apps", apps.list_apps, methods=["GET"]),
    Route("/v1/apps/{app}", apps.get_app, methods=["GET"]),
    Route("/v1/apps/{app}", apps.delete_app, methods=["DELETE"]),
    Route("/v1/apps/{app}/deployments", apps.deploy, methods=["POST"]),
    Route("/v1/apps/{app}/logs", apps.app_logs, methods=["GET"]),
    Route("/v1/apps/{app}/dead", calls.dead_letters, methods=["GET"]),
    Route("/v1/apps/{app}/dead/replay", calls.replay_dead, methods=["POST"]),
    Route("/v1/apps/{app}/scale", status.scale, methods=["POST"]),
    Route("/v1/status", status.get_status, methods=["GET"]),
    Route("/v1/calls/{call_id}", calls.get_call, methods=["GET"]),
    Route("/v1/calls/{call_id}", calls.cancel_call, methods=["DELETE"]),
    Route("/v1/{app}/{name}/spawn", calls.spawn, methods=["POST"]),
    Route("/v1/{app}/{name}", calls.invoke, methods=["POST"]),
]


def create_app(settings: Settings | None = None) -> Gateway:
    """The control plane's ASGI app; it connects to NATS on startup and drains on shutdown."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        platform = await Platform.start(settings)
        app.state.platform = platform
        try:
            yield
        finally:
            await platform.stop()

    return Gateway(Starlette(routes=ROUTES, lifespan=lifespan,
                             exception_handlers={EmberError: ember_error_handler, HTTPException: http_error_handler}))


class Gateway:
    """The ASGI entry point. ``POST /v1/<app>/<fn>``, the synchronous call and the hot path, goes straight to
    its handler; everything else (and the lifespan) goes through starlette's router and middleware.

    Matching one path shape by hand skips the route table's regexes and three middleware layers, about a
    fifth of the gateway's CPU per call. It takes only what the route table would give ``calls.invoke``: a
    first segment that names one of the API's own routes (``RESERVED_APP_NAMES``, which no app may take) goes
    through the table, where ``POST /v1/apps/x`` is a 405, not a call to an app named ``apps``.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")
            if len(parts) == 4 and parts[0] == "" and parts[1] == "v1" and parts[2] and parts[3] \
                    and parts[2] not in RESERVED_APP_NAMES:
                scope["app"] = self.app
                scope["path_params"] = {"app": parts[2], "name": parts[3]}
                try:
                    response = await calls.invoke(Request(scope, receive))
                except EmberError as exc:
                    response = ember_error_response(exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
