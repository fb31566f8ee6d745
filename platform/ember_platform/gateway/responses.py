"""What every route answers with: JSON bodies, and the hot path's hand-built 200."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ember.wire import encoder
from ember_platform.platform import Platform


def platform_of(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def json_response(value: object, status: int = 200) -> Response:
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

