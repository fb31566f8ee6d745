"""The gateway's spans (see ``ember._tracing``): ``ember.gateway`` around a synchronous call, ``ember.spawn`` around a
queued one, each a server span that continues the client's W3C ``traceparent`` when it sent a valid one
(``ember.relay``, around a call one function makes of another, is started by ``relay`` itself).

The span is the current one while the handler runs: the router (``Invocation.trace``) and the durable queue (the
message's ``traceparent`` header) read it from there to carry it on to the replica.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ember import _tracing as tracing
from ember._errors import EmberError
from ember_platform.gateway.guard import Endpoint
from ember_platform.gateway.metrics import CALLED


def traced(endpoint: Endpoint, name: str, route: str) -> Endpoint:
    """``endpoint`` inside a server span named ``name`` while tracing is on (``route``: its path template)."""
    @functools.wraps(endpoint)
    async def with_span(request: Request) -> Any:
        if not tracing.ON:
            return await endpoint(request)
        span = tracing.start(name, tracing.parent_from(request.headers), kind="server",
                             attributes={"http.request.method": request.method, "http.route": route})
        token = tracing.activate(span)
        code, error = 500, ""
        try:
            response = await endpoint(request)
            code = getattr(response, "status_code", 200)
            return response
        except EmberError as exc:
            code, error = exc.http_status, exc.code
            raise
        except HTTPException as exc:
            code, error = exc.status_code, str(exc.status_code)
            raise
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            tracing.deactivate(token)
            if span.is_recording():  # (most calls' are not, when sampled: nothing to describe)
                _describe(span, request, code)
                if error and code < 500:
                    span.set_attribute("error.type", error)  # a client's mistake: the server span did not fail
            tracing.end(span, error if code >= 500 else None)

    return with_span


def _describe(span: Any, request: Request, code: int) -> None:
    """The call's function, once the handler found it (before that, the path is the client's, unchecked)."""
    span.set_attribute("http.response.status_code", code)
    called = request.scope.get(CALLED)
    if called is not None:
        app, function, version = called
    elif code < 400:
        app, function, version = request.path_params.get("app", ""), request.path_params.get("name", ""), 0
    else:
        return
    span.set_attributes({"ember.app": app, "ember.function": function})
    if version:
        span.set_attribute("ember.version", version)

