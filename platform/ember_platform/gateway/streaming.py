"""The HTTP side of a streaming (generator) function's synchronous call: its items as they come.

``Accept: text/event-stream`` gets Server-Sent Events: each item is an ``item`` event whose ``data`` is the item's
JSON and whose ``id`` is its number; the stream ends with an ``end`` event (``{"items": n}``) or, when the
generator fails after the first item, an ``error`` event (``{"error": {...}}``, the usual error shape).
``Accept: application/json`` alone gets the items collected into one JSON list (at most ``MAX_COLLECTED_BYTES``).
Anything else gets newline-delimited JSON (``application/x-ndjson``), one object per line: ``{"item": ...}`` per
item, then ``{"end": true, "items": n}`` or ``{"error": {...}}``, so that a reader tells a finished stream from a
cut connection and an item from an error. Chunked transfer either way.

An error before the first item is an ordinary error answer (its 4xx or 5xx). A client that goes away cancels
the stream: the replica closes the generator, whose ``finally`` runs; a client waiting for the collected JSON list is
watched meanwhile (``watch``), as one waiting for its first item is.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ember._errors import EmberError, PayloadTooLargeError
from ember.wire import HTTP_CALL_ID_HEADER, HTTP_VERSION_HEADER, ErrorBody, encoder, error_info
from ember_platform.calls.streams import CallStream
from ember_platform.gateway.binary import UnsupportedMediaType
from ember_platform.platform import Platform
from ember_platform.quotas.limiter import Held

log = logging.getLogger("ember.gateway")

Mode = Literal["sse", "ndjson", "json"]
Watch = Callable[[Request, Coroutine[Any, Any, Any]], Awaitable[Any]]
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
MAX_COLLECTED_BYTES = 64 * 1024 * 1024  # a stream collected into one JSON answer (Accept: application/json)
MAX_ACCEPT_ITEMS = 32


def mode_of(accept: str | None) -> Mode:
    """How to answer, from the ``Accept`` header (anything unreadable in it counts as no preference)."""
    wanted = set()
    for item in (accept or "").split(",")[:MAX_ACCEPT_ITEMS]:
        media, _, params = item.partition(";")
        if params.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            continue
        wanted.add(media.strip().lower())
    if SSE in wanted:
        return "sse"
    if "application/json" in wanted and not wanted & {NDJSON, "application/jsonl", "*/*", "application/*"}:
        return "json"
    return "ndjson"


async def respond(request: Request, platform: Platform, app: str, function: str, version: int, body: bytes, *,
                  call_id: str, deadline: float, packed: bool, held: Held | None, watch: Watch) -> Response:
    """Start the stream; answer with its items (see the module's docstring). ``held`` (a quota's concurrency slot)
    is released when the stream ends, however it ends; ``watch`` runs the wait for the first item (and for all of
    them, collected into one JSON list), and gives None if the client went away meanwhile."""
    try:
        if packed:
            raise UnsupportedMediaType(f"{function} streams its items as JSON; send its input as JSON",
                                       field="Content-Type")
        mode = mode_of(request.headers.get("accept"))
        stream = platform.streams.open(app, function, version, body, call_id=call_id, deadline=deadline)
        try:
            started = await watch(request, _first(stream))  # errors before the first item are the answer's status
        except BaseException:
            await stream.aclose()
            raise
        if started is None:  # the client is gone; nobody reads this
            await stream.aclose()
            return Response(status_code=499)
        first = started[0]
    except BaseException:
        if held is not None:
            held.release()
        raise
    headers = {HTTP_CALL_ID_HEADER: call_id, HTTP_VERSION_HEADER: str(version)}
    if mode == "json":
        try:
            collected = await watch(request, _collect(stream, first))
        finally:
            await stream.aclose()
            if held is not None:
                held.release()
        if collected is None:  # the client is gone: the stream was closed, its generator with it
            log.info("stream %s of %s.%s left after %d item(s) while collected: cancelled", stream.call_id,
                     stream.app, stream.function, stream.received)
            return Response(status_code=499)
        return Response(collected, media_type="application/json", headers=headers)
    headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    events = _sse if mode == "sse" else _ndjson
    return StreamingResponse(_released(stream, events(stream, first), held), media_type=SSE if mode == "sse"
                             else NDJSON, headers=headers)


async def _first(stream: CallStream) -> tuple[list[msgspec.Raw] | None]:
    await stream.start()
    return (await stream.next_items(),)


async def _released(stream: CallStream, events: AsyncIterator[bytes], held: Held | None) -> AsyncIterator[bytes]:
    """``events``; however they end (the end, an error, the client gone), the stream is closed and ``held``
    released. A stream left before its end is said in the log (its call is cancelled, and the calls it made)."""
    try:
        async for event in events:
            yield event
    except BaseException as exc:
        if not stream.finished:
            log.info("stream %s of %s.%s left after %d item(s) (%s): cancelled", stream.call_id, stream.app,
                     stream.function, stream.received, type(exc).__name__)
        raise
    finally:
        if held is not None:  # before any await: a cancel there would leave the slot held for good
            held.release()
        await stream.aclose()


Format = Callable[[int, msgspec.Raw], bytes]  # one item, given its number, as it goes on the wire


async def _written(stream: CallStream, first: list[msgspec.Raw] | None, item: Format,
                   fail: Callable[[EmberError], bytes], end: Callable[[int], bytes]) -> AsyncIterator[bytes]:
    """The stream as the answer's body: the items of each message from the replica in one write (so a fast stream
    costs a write per message, not per item), then ``end`` with their count, or ``fail``'s error if it failed."""
    count, items = 0, first
    while items is not None:
        yield b"".join(item(count + k, raw) for k, raw in enumerate(items))
        count += len(items)
        try:
            items = await stream.next_items()
        except EmberError as exc:
            yield fail(exc)
            return
    yield end(count)


def _sse(stream: CallStream, first: list[msgspec.Raw] | None) -> AsyncIterator[bytes]:
    return _written(stream, first, lambda n, raw: b"event: item\nid: %d\ndata: %s\n\n" % (n, raw),
                    lambda exc: b"event: error\ndata: %s\n\n" % _error(exc, stream),
                    lambda count: b'event: end\ndata: {"items":%d}\n\n' % count)


def _ndjson(stream: CallStream, first: list[msgspec.Raw] | None) -> AsyncIterator[bytes]:
    return _written(stream, first, lambda _n, raw: b'{"item":%s}\n' % raw,
                    lambda exc: _error(exc, stream) + b"\n", lambda count: b'{"end":true,"items":%d}\n' % count)


async def _collect(stream: CallStream, first: list[msgspec.Raw] | None) -> bytes:
    parts: list[bytes] = []
    size, items = 2, first
    while items is not None:
        for item in items:
            size += len(item) + 1
            if size > MAX_COLLECTED_BYTES:
                raise PayloadTooLargeError(f"the stream is over {MAX_COLLECTED_BYTES} bytes, the most collected into "
                                           f"one JSON answer; ask for {NDJSON} or {SSE} to read it as it comes",
                                           call_id=stream.call_id)
            parts.append(bytes(item))
        items = await stream.next_items()
    return b"[" + b",".join(parts) + b"]"


def _error(exc: EmberError, stream: CallStream) -> bytes:
    info = error_info(exc, stream.call_id)
    return encoder.encode(ErrorBody(error=info))
