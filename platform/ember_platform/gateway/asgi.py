"""The starlette application: the route table, error handlers, and a lifespan that owns the process's state.

To add a route: write its handler in the module of its group (``calls``, ``apps``, ``status``, ``metrics``,
``health``, ``tokens``), add it to ``ROUTES`` here with what it needs (a scope, ``TOKEN`` or ``OPEN``: see
``guard``), and give it a test that sends it hostile input.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ember import _tracing as tracing
from ember._errors import EmberError
from ember.wire import RESERVED_APP_NAMES
from ember_platform.auth.scopes import ADMIN, DEPLOY, EVENTS, INVOKE, READ
from ember_platform.config import Settings
from ember_platform.console import routes as console
from ember_platform.gateway import (
    apps,
    builds,
    calls,
    events,
    health,
    logs,
    metrics,
    oip,
    openai_api,
    openai_embeddings,
    openapi,
    quotas,
    rollouts,
    schedules,
    secrets,
    stats,
    status,
    subjects,
    tokens,
    volumes,
)
from ember_platform.gateway.errors import ember_error_handler, ember_error_response, http_error_handler
from ember_platform.gateway.guard import OPEN, TOKEN, route
from ember_platform.gateway.tracing import traced
from ember_platform.platform import Platform

INVOKE_METERED = metrics.metered(calls.invoke)  # the synchronous call, counted for GET /metrics
INVOKE_TRACED = traced(INVOKE_METERED, "ember.gateway", "/v1/{app}/{name}")  # and in a span, when tracing is on
OIP_INFER = traced(metrics.metered(oip.infer), "ember.gateway", "/v2/models/{model}/infer")  # counted too
class _Matching(Convertor[str]):
    """A path parameter that is whatever ``regex`` matches, as text; its handler checks it (a malformed one is a 4xx
    naming it)."""

    def __init__(self, regex: str) -> None:
        self.regex = regex  # type: ignore[misc]  # starlette reads it per instance

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


def _any_but(literal: str) -> _Matching:
    """A path segment, any but ``literal``: where a route ``.../{x}`` sits beside ``.../<literal>`` of other methods,
    so that ``.../<literal>`` is answered as that path alone (``PUT .../chunks/missing``: a 405 allowing POST, not a
    chunk named "missing")."""
    return _Matching(f"(?!{re.escape(literal)}$)[^/]+")


register_url_convertor("chunk", _any_but("missing"))
register_url_convertor("token", _any_but("self"))
# The rest of the path, whatever it holds: starlette's ``path`` (``.*``) stops at a newline (``%0A``), which left
# ``POST /v2/%0A...`` to the router's 404 in Ember's error shape rather than the protocol's own.
register_url_convertor("rest", _Matching("(?s:.*)"))

ROUTES = [
    route("/healthz", health.healthz, "GET", OPEN),
    route("/readyz", health.readyz, "GET", OPEN),
    route("/metrics", metrics.metrics, "GET", READ),
    route("/ui", console.index, "GET", OPEN),  # the console's static shell; its data needs a token
    route("/ui/{name}", console.asset, "GET", OPEN),
    route("/v1/stats", stats.get_stats, "GET", READ),
    route("/openapi.json", openapi.document, "GET", READ),
    route("/v1/bundles/{sha256}", apps.put_bundle, "PUT", DEPLOY),
    route("/v1/apps", apps.list_apps, "GET", READ),
    route("/v1/apps/{app}", apps.get_app, "GET", READ),
    route("/v1/apps/{app}", apps.delete_app, "DELETE", DEPLOY),
    route("/v1/apps/{app}/deployments", apps.deploy, "POST", DEPLOY),
    route("/v1/apps/{app}/builds", builds.start_build, "POST", DEPLOY),
    route("/v1/apps/{app}/builds/{build_id}", builds.get_build, "GET", DEPLOY),
    route("/v1/apps/{app}/logs", logs.app_logs, "GET", READ),
    route("/v1/apps/{app}/dead", calls.dead_letters, "GET", READ),
    route("/v1/apps/{app}/dead/replay", calls.replay_dead, "POST", INVOKE),
    route("/v1/apps/{app}/scale", status.scale, "POST", DEPLOY),
    route("/v1/apps/{app}/promote", rollouts.promote, "POST", DEPLOY),
    route("/v1/apps/{app}/rollback", rollouts.rollback, "POST", DEPLOY),
    route("/v1/apps/{app}/schedules/{name}/pause", schedules.pause, "POST", DEPLOY),
    route("/v1/apps/{app}/schedules/{name}/resume", schedules.resume, "POST", DEPLOY),
    route("/v1/apps/{app}/schedules/{name}/run", schedules.run, "POST", DEPLOY),
    route("/v1/schedules", schedules.list_schedules, "GET", READ),
    route("/v1/status", status.get_status, "GET", READ),
    route("/v1/tokens", tokens.create_token, "POST", ADMIN),
    route("/v1/tokens", tokens.list_tokens, "GET", ADMIN),
    route("/v1/tokens/self", tokens.own_token, "GET", TOKEN),
    route("/v1/tokens/{token_id:token}", tokens.revoke_token, "DELETE", ADMIN),  # not .../self
    route("/v1/quotas", quotas.list_quotas, "GET", ADMIN),
    route("/v1/quotas/{quota}", quotas.put_quota, "PUT", ADMIN),
    route("/v1/quotas/{quota}", quotas.delete_quota, "DELETE", ADMIN),
    route("/v1/subjects", subjects.list_grants, "GET", ADMIN),
    route("/v1/subjects/grant", subjects.grant, "POST", ADMIN),
    route("/v1/subjects/revoke", subjects.revoke, "POST", ADMIN),
    route("/v1/volumes", volumes.list_volumes, "GET", READ),
    route("/v1/volumes/-/chunks/{sha256:chunk}", volumes.put_chunk, "PUT", DEPLOY),  # not .../missing
    route("/v1/volumes/-/chunks/missing", volumes.missing_chunks, "POST", DEPLOY),
    route("/v1/volumes/{volume}", volumes.get_volume, "GET", READ),  # and the volume's name: checked inside
    route("/v1/volumes/{volume}", volumes.delete_volume, "DELETE", DEPLOY),
    route("/v1/volumes/{volume}/versions", volumes.commit_version, "POST", DEPLOY),
    route("/v1/secrets", secrets.list_secrets, "GET", ADMIN),
    route("/v1/secrets/{secret}", secrets.put_secret, "PUT", ADMIN),
    route("/v1/secrets/{secret}", secrets.delete_secret, "DELETE", ADMIN),
    route("/v1/calls/{call_id}", calls.get_call, "GET", INVOKE),  # and invoke on the call's app: checked inside
    route("/v1/calls/{call_id}", calls.cancel_call, "DELETE", INVOKE),
    route("/v1/events/{subject}", events.publish, "POST", EVENTS),
    route("/v2", oip.server_metadata, "GET", READ),  # the Open Inference Protocol: the /v2 routes check themselves
    route("/v2/health/live", oip.live, "GET", OPEN),
    route("/v2/health/ready", oip.ready, "GET", OPEN),
    route("/v2/repository/index", oip.repository_index, "POST", READ),
    route("/v2/models", oip.list_models, "GET", READ),
    route("/v2/models/{model}", oip.model_metadata, "GET", READ),
    route("/v2/models/{model}/config", oip.model_config, "GET", READ),
    route("/v2/models/{model}/versions/{version}/config", oip.model_config, "GET", READ),
    route("/v2/models/{model}/versions/{version}", oip.model_metadata, "GET", READ),
    route("/v2/models/{model}/ready", oip.model_ready, "GET", READ),
    route("/v2/models/{model}/versions/{version}/ready", oip.model_ready, "GET", READ),
    route("/v2/models/{model}/infer", OIP_INFER, "POST", INVOKE),  # a public function's needs no token
    route("/v2/models/{model}/versions/{version}/infer", OIP_INFER, "POST", INVOKE),
    route("/v2/{path:rest}", oip.unknown, "GET", TOKEN),  # the protocol's 404 for any other /v2 path
    route("/v2/{path:rest}", oip.unknown, "POST", TOKEN),
    route("/openai/v1/chat/completions", openai_api.chat_completions, "POST", INVOKE),  # OpenAI's: check themselves
    route("/openai/v1/completions", openai_api.completions, "POST", INVOKE),
    route("/openai/v1/embeddings", traced(metrics.metered(openai_embeddings.embeddings), "ember.gateway",
                                          "/openai/v1/embeddings"), "POST", INVOKE),  # counted as a call
    route("/openai/v1/models", openai_api.list_models, "GET", READ),
    route("/openai/v1/models/{model_id:rest}", openai_api.get_model, "GET", READ),
    route("/v1/{app}/{name}/spawn", traced(metrics.metered(calls.spawn), "ember.spawn", "/v1/{app}/{name}/spawn"),
          "POST", INVOKE),  # counted as answered when queued (202)
    route("/v1/{app}/{name}", INVOKE_METERED, "POST", INVOKE),  # checks itself: a public function needs no token
]


def create_app(settings: Settings | None = None, *, on_first_token: Callable[[str], None] | None = None,
               beside: Callable[[Platform], AbstractAsyncContextManager[object]] | None = None) -> Gateway:
    """The control plane's ASGI app; it connects to NATS on startup and drains on shutdown. ``on_first_token`` is
    given the installation's first admin token when this start created it (to show it, once). ``beside``: what
    else serves the platform (the gRPC server), entered once it has started and left before it stops."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        platform = await Platform.start(settings)
        app.state.platform = platform
        if platform.first_token and on_first_token is not None:
            on_first_token(platform.first_token)
        try:
            async with beside(platform) if beside is not None else nullcontext():
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
        self._invoke = INVOKE_TRACED if tracing.ON else INVOKE_METERED  # untraced: not even a test per call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")
            if len(parts) == 4 and parts[0] == "" and parts[1] == "v1" and parts[2] and parts[3] \
                    and parts[2] not in RESERVED_APP_NAMES:
                scope["app"] = self.app
                scope["path_params"] = {"app": parts[2], "name": parts[3]}
                try:
                    response = await self._invoke(Request(scope, receive))
                except EmberError as exc:
                    response = ember_error_response(exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
