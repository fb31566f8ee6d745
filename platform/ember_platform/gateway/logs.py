"""``GET /v1/apps/<app>/logs``: the replicas' output, as a list of the kept lines or, with ``follow=true``, pushed as
it comes (newline-delimited JSON when the client accepts ``application/x-ndjson``, as ``ember logs -f`` does,
else Server-Sent Events).

Filters: ``service``, ``replica``, ``stream`` (stdout, stderr or agent), ``since`` (exclusive) and ``until``
(inclusive, timestamps); ``limit`` lines (the last ones). A follower first gets the kept lines its filter wants (at
most ``limit``), then each new one, and a keep-alive (an SSE comment, or an empty line) after ``KEEPALIVE_S`` of
quiet. Its token is checked again before each delivery, so a revoked or expired token ends the stream. A follower
that falls behind loses the oldest lines it has not read and gets a ``dropped`` event saying how many.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ember._errors import BadRequestError, EmberError, NotFoundError, OverloadedError
from ember.wire import LogLine, encoder, error_info
from ember_platform.auth.scopes import READ
from ember_platform.control.logfeed import LogFilter, TooManyFollowersError
from ember_platform.gateway.apps import log_window
from ember_platform.gateway.guard import authorization, principal_of
from ember_platform.gateway.responses import json_response, platform_of

KEEPALIVE_S = 15.0
STREAMS = ("stdout", "stderr", "agent")
_MAX_ID = 128  # a replica id longer than this names no replica


async def app_logs(request: Request) -> Response:
    platform = platform_of(request)
    app = request.path_params["app"]
    view = platform.registry.view(app)  # 404 for an unknown app
    query = request.query_params
    since, limit = log_window(query)
    flt = LogFilter(app=app, service=_service(query, app, [s.name for s in view.services]), replica=_replica(query),
                    stream=_stream(query), since=since, until=_until(query))
    follow = _follow(query)
    kept = platform.registry.logs(flt, limit)
    if not follow:
        return json_response(kept)
    try:
        follower = platform.registry.log_feed.open(flt, principal_of(request).token_id)
    except TooManyFollowersError as exc:
        raise OverloadedError(f"{exc}; try again later", retry_after_s=KEEPALIVE_S) from None
    # Server-Sent Events unless the client asks for newline-delimited JSON: SSE is what HTTP tools (browsers,
    # fuzzers, proxies) know to read as a stream that does not end
    sse = "application/x-ndjson" not in request.headers.get("accept", "")
    header = authorization(request)

    async def lines() -> AsyncIterator[bytes]:
        try:
            for line in kept:
                yield _frame(sse, "line", line)
            while True:
                new, dropped = await follower.next_lines(KEEPALIVE_S)
                try:  # still allowed to read this app's logs? (a token revoked or expired since)
                    platform.tokens.authenticate(header).require(READ, app)
                except EmberError as exc:
                    yield _frame(sse, "error", {"error": error_info(exc)})
                    return
                if dropped:
                    yield _frame(sse, "dropped", {"dropped": dropped})
                for line in new:
                    yield _frame(sse, "line", line)
                if not new and not dropped:
                    yield b": keep-alive\n\n" if sse else b"\n"
        finally:
            platform.registry.log_feed.close(follower)

    media = "text/event-stream" if sse else "application/x-ndjson"
    return StreamingResponse(lines(), media_type=media, headers={"Cache-Control": "no-store",
                                                                  "X-Accel-Buffering": "no"})


def _frame(sse: bool, event: str, value: LogLine | Mapping[str, object]) -> bytes:
    """One event: ``event: <kind>`` and ``data: <json>`` for SSE; a JSON line otherwise (lines are bare
    ``LogLine`` objects, other events carry their kind in ``event``)."""
    if sse:
        return b"event: %s\ndata: %s\n\n" % (event.encode(), encoder.encode(value))
    if isinstance(value, LogLine):
        return encoder.encode(value) + b"\n"
    return encoder.encode({"event": event, **value}) + b"\n"


def _follow(query: Mapping[str, str]) -> bool:
    raw = query.get("follow", "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise BadRequestError("follow is true or false", field="follow")
    return raw in ("true", "1")


def _service(query: Mapping[str, str], app: str, names: list[str]) -> str | None:
    service = query.get("service") or None
    if service is not None and service not in names:
        shown = service if len(service) <= 80 else service[:80] + "..."
        raise NotFoundError(f"app {app!r} has no service {shown!r} (it has: {', '.join(names)})")
    return service


def _replica(query: Mapping[str, str]) -> str | None:
    replica = query.get("replica") or None
    if replica is not None and (len(replica) > _MAX_ID or not replica.isascii() or not replica.isprintable()):
        raise BadRequestError("replica is a replica id, as `ember status` shows it", field="replica")
    return replica


def _stream(query: Mapping[str, str]) -> str | None:
    stream = query.get("stream") or None
    if stream is not None and stream not in STREAMS:
        raise BadRequestError(f"stream is one of {', '.join(STREAMS)}", field="stream")
    return stream


def _until(query: Mapping[str, str]) -> float | None:
    raw = query.get("until")
    if raw is None:
        return None
    try:
        until = float(raw)
    except ValueError:
        until = math.nan
    if not 0 <= until < math.inf:  # before since: a window no line is in, so none is answered
        raise BadRequestError("until is a timestamp: a finite number of seconds since the epoch, 0 or more",
                              field="until")
    return until

