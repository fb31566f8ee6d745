"""OpenAI-compatible routes: ``POST /openai/v1/chat/completions``, ``POST /openai/v1/completions``,
``GET /openai/v1/models[/<model>]``.

A model is a generator of text pieces (or a ``Continuous`` step) declared with ``openai="NAME"``; the body's
``model`` picks it. The token is the API key (``Authorization: Bearer``) with Ember's scopes: invoking needs
``invoke`` on the model's app, and a model of an app the token does not see is a 404, as one that does not exist.
The request is checked here (its bounds are those of ``ember.wire.openai``), then sent to the function as its one
input; its pieces come back over the stream of a streamed call, and the platform cuts them at ``max_tokens`` pieces
and at the first stop string, whatever the function does (closing the stream: the replica closes the generator, or
drops the sequence at its next step). A client that goes away closes it too. Errors are OpenAI's shape.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ember._errors import BadRequestError, EmberError, InvalidInputError, NotFoundError, PayloadTooLargeError
from ember.wire import Deployment, FunctionSpec, ServiceSpec
from ember.wire.openai import (
    MAX_EXTRA_FIELDS,
    MAX_TEXT_CHARS,
    ChatBody,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Message,
    Model,
    ModelList,
)
from ember.wire.openai import Request as LlmRequest
from ember_platform.auth.scopes import INVOKE, READ
from ember_platform.calls.streams import CallStream
from ember_platform.gateway import calls
from ember_platform.gateway.binary import body_limit, over_limit
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import TOKEN, authorize, checks_itself
from ember_platform.gateway.openai_text import Format, Shaper, error_event, error_response, not_text
from ember_platform.gateway.responses import platform_of
from ember_platform.metrics.llm import LlmTimer
from ember_platform.platform import Platform

Handler = Callable[[Request], Awaitable[Response]]
_decoders: dict[str, msgspec.json.Decoder[Any]] = {"chat": msgspec.json.Decoder(ChatBody),
                                                   "completion": msgspec.json.Decoder(CompletionRequest),
                                                   "embedding": msgspec.json.Decoder(EmbeddingRequest)}
_fields = {kind: set(decoder.type.__struct_fields__) for kind, decoder in _decoders.items()}
_head = msgspec.json.Decoder(dict[str, msgspec.Raw])
_raw_encoder = msgspec.json.Encoder()
_NULL_IS_DEFAULT = frozenset({"stream", "n", "echo"})  # OpenAI's schema has them nullable; Ember's requests do not
_encoder = msgspec.json.Encoder()
_str = msgspec.json.Decoder(str)
_PART_TYPE = re.compile(r"(?:\$\.)?messages\[\d+\]\.content\[\d+\]\.type")  # a content part that is not text


def openai_errors(handler: Handler) -> Handler:
    """Answer the handler's errors in OpenAI's shape."""
    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except EmberError as exc:
            return error_response(exc)

    return answered


# -- models ----------------------------------------------------------------------------------------

def models_of(platform: Platform) -> dict[str, tuple[str, FunctionSpec, list[int]]]:
    """Every served model: name -> (app, its function, the versions that serve it), from the versions that take
    calls now (a version being rolled out serves its new models once it takes calls). The versions are those whose
    function of that name serves it, whatever else of it changed (a canary with another ``max_seqs`` takes its share,
    not every call); the function given is the newest one's, not public if any of theirs is not."""
    found: dict[str, tuple[str, FunctionSpec, list[int]]] = {}
    for app, dep in platform.registry.deployments.items.items():
        for share in sorted(dep.serving(), key=lambda s: -s.version):  # the newest one's function first
            at = dep.at(share.version)
            for fn in (f for svc in (at.manifest.services if at else []) for f in svc.functions if f.openai):
                if fn.openai not in found:
                    found[fn.openai] = (app, fn, [share.version])
                    continue
                held_app, held, versions = found[fn.openai]
                if (held_app, held.name) == (app, fn.name):
                    found[fn.openai] = (app, held if fn.public or not held.public else fn, [*versions, share.version])
    return found


def find_model(request: Request, name: str) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
    """The model ``name``, once the request may invoke it (a public function's needs no token): a version of its
    app that serves it, drawn by the traffic split among those that do."""
    platform = platform_of(request)
    found = models_of(platform).get(name)
    if found is None:
        authorize(request, INVOKE)  # without a token, nobody learns which models exist
        raise _no_model(name)
    app, fn, versions = found
    if not fn.public:
        authorize(request, INVOKE)  # the scope first, as for a name no model has: a 403 either way, never a 404 that
        # tells a token without it that another team serves the model
        try:
            authorize(request, INVOKE, app)
        except NotFoundError:
            raise _no_model(name) from None
    with contextlib.suppress(NotFoundError):
        drawn = platform.registry.route(app, fn.name, None, random.random())
        if drawn[0].version in versions:
            return drawn
    # The split drew a version that does not serve this model (one a canary adds): a version that does takes it.
    return platform.registry.route(app, fn.name, random.choice(versions), 0.0)


def _no_model(name: str) -> NotFoundError:
    return NotFoundError(f"The model `{name[:256]}` does not exist (GET /openai/v1/models lists those this key may "
                         "use)", field="model")


@checks_itself(READ)
@openai_errors
async def list_models(request: Request) -> Response:
    """``GET /openai/v1/models``: the models the token may invoke."""
    principal = authorize(request, TOKEN)
    platform = platform_of(request)
    items = platform.registry.deployments.items
    data = [Model(id=name, created=int(items[app].created_at), owned_by=app)
            for name, (app, _, _) in sorted(models_of(platform).items())
            if principal.sees(app) and principal.may(INVOKE)]
    return Response(_encoder.encode(ModelList(data=data)), media_type="application/json")


@checks_itself(READ)
@openai_errors
async def get_model(request: Request) -> Response:
    """``GET /openai/v1/models/<model>``."""
    name = request.path_params["model_id"]
    dep, _, _ = find_model(request, name)
    return Response(_encoder.encode(Model(id=name, created=int(dep.created_at), owned_by=dep.app)),
                    media_type="application/json")


# -- completions -----------------------------------------------------------------------------------

@checks_itself(INVOKE)
@openai_errors
async def chat_completions(request: Request) -> Response:
    """``POST /openai/v1/chat/completions``."""
    return await _complete(request, "chat")


@checks_itself(INVOKE)
@openai_errors
async def completions(request: Request) -> Response:
    """``POST /openai/v1/completions``."""
    return await _complete(request, "completion")


def parse(kind: str, body: bytes) -> Any:
    """The request, its unknown fields in ``extra``: 422 naming the field that does not fit, 400 for bad JSON. A
    field sent as null that has a default (``stream``, ``n``, ``echo``) takes its default, as OpenAI's API does."""
    head = decode_json(_head, body)
    nulls = [k for k in _NULL_IS_DEFAULT & head.keys() if bytes(head[k]) == b"null"]
    if nulls:
        head = {k: v for k, v in head.items() if k not in nulls}
        body = _raw_encoder.encode(head)
    extra = {k: v for k, v in head.items() if k not in _fields[kind]}
    if len(extra) > MAX_EXTRA_FIELDS:
        raise InvalidInputError(f"at most {MAX_EXTRA_FIELDS} fields that Ember does not read", field="$")
    try:
        req: LlmRequest | ChatBody | EmbeddingRequest = decode_json(_decoders[kind], body)
    except InvalidInputError as exc:
        if kind == "embedding" and (exc.field or "").startswith("$.input[") and "got `str`" not in str(exc):
            raise InvalidInputError("input is text: a string or a list of strings (token ids are not taken)",
                                    field=exc.field) from exc
        if exc.field is None or not _PART_TYPE.fullmatch(exc.field):
            raise
        raise InvalidInputError('only text parts ({"type": "text", "text": ...}) are served in a message\'s content',
                                field=exc.field) from exc
    if isinstance(req, ChatBody):
        req = _chat_request(req)
    if extra:
        req = msgspec.structs.replace(req, extra={k: decode_json(msgspec.json.Decoder(), bytes(v))
                                                  for k, v in extra.items()})
    return req


def _chat_request(body: ChatBody) -> ChatRequest:
    """The ``ChatRequest`` a model receives: each message's content as one string (text parts joined, null as
    empty); 422 naming the message whose joined text is over ``MAX_TEXT_CHARS``."""
    messages = []
    for n, sent in enumerate(body.messages):
        text = sent.text()
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInputError(f"a message's content is at most {MAX_TEXT_CHARS} characters, its parts joined",
                                    field=f"messages[{n}].content")
        messages.append(Message(role=sent.role, content=text, name=sent.name))
    fields = {name: getattr(body, name) for name in ChatBody.__struct_fields__ if name != "messages"}
    return ChatRequest(messages=messages, **fields)


async def admitted(request: Request, kind: str) -> tuple[Any, Deployment, ServiceSpec, FunctionSpec, str]:
    """The request of an OpenAI route (``kind``: chat, completion or embedding), once its body is within the model's
    limit, well formed, names a model of the right kind that the token may invoke: the request, the model's
    deployment, service and function, and the token's id ("" for a public model)."""
    platform = platform_of(request)
    try:  # within the largest limit of a served model, until the body names its model (whose own limit then holds)
        body = await read_body(request, largest_limit(platform))
    except PayloadTooLargeError as exc:
        raise PayloadTooLargeError(f"{exc} (the largest max_body_bytes of a model, or EMBER_MAX_BODY_BYTES)",
                                   field="body") from exc
    # A public model needs no token, and which model is asked is in the body: a token given is checked at once; with
    # none, a body that names no public model is a 401, whatever else is wrong with it (nothing of it is told).
    if request.headers.get("authorization") is not None:
        authorize(request, TOKEN)
    try:
        check_model_limit(request, platform, body)
        req = parse(kind, body)
        dep, svc, fn = find_model(request, req.model)
        if fn.stream and kind == "embedding":
            raise BadRequestError(f"The model `{req.model}` generates text (POST /openai/v1/chat/completions or "
                                  "/openai/v1/completions), not embeddings", field="model")
        if not fn.stream and kind != "embedding":
            raise BadRequestError(f"The model `{req.model}` makes embeddings (POST /openai/v1/embeddings), not text",
                                  field="model")
    except EmberError:
        authorize(request, TOKEN)
        raise
    return req, dep, svc, fn, "" if fn.public else authorize(request, INVOKE, dep.app).token_id


async def _complete(request: Request, kind: str) -> Response:
    platform = platform_of(request)
    req, dep, svc, fn, token = await admitted(request, kind)
    held = platform.quotas.limiter.admit(dep.app, token)
    call_id = os.urandom(16).hex()
    stream = platform.streams.open(dep.app, fn.name, dep.version, _encoder.encode(req), call_id=call_id,
                                   deadline=time.time() + svc.timeout_s)
    timer = LlmTimer(platform.llm_metrics, req.model, dep.app)
    try:
        started = await calls._unless_disconnected(request, _first(stream))
    except BaseException:
        await _done(stream, held, timer)
        raise
    if started is None:
        await _done(stream, held, timer)
        return Response(status_code=499)
    timer.first()
    answer = Format(kind, call_id, req.model, req)
    shaper = Shaper(req.limit, req.stops, collect=not req.stream)
    pieces = _pieces(stream, started[0], shaper, timer)
    if not req.stream:
        try:
            whole = await calls._unless_disconnected(request, _collected(pieces))
        finally:
            await _done(stream, held, timer)
        if whole is None:  # the client is gone: the stream was closed, its generator or sequence with it
            return Response(status_code=499)
        return Response(answer.whole(shaper), media_type="application/json", headers={"X-Ember-Call-Id": call_id})
    usage = req.stream_options is not None and req.stream_options.include_usage
    return StreamingResponse(_events(stream, pieces, answer, shaper, usage, held, timer),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      "X-Ember-Call-Id": call_id})


def check_model_limit(request: Request, platform: Platform, body: bytes) -> None:
    """413 for a body over its model's own limit, before the body is checked field by field (a model the request
    may not invoke, or a body that names none, is left to ``parse`` and ``find_model``)."""
    if len(body) <= platform.settings.max_body_bytes and len(body) <= min(
            (body_limit(platform, fn) for _, fn in _openai_functions(platform)), default=len(body)):
        return  # within every model's limit
    try:
        name = _str.decode(decode_json(_head, body)["model"])
        dep, _, fn = find_model(request, name)
    except (EmberError, KeyError, msgspec.ValidationError, msgspec.DecodeError):
        return
    if len(body) > body_limit(platform, fn):
        raise over_limit(platform, dep.app, fn, f"the body of {len(body)} bytes is over the limit")


def _openai_functions(platform: Platform) -> list[tuple[str, FunctionSpec]]:
    return [(app, fn) for app, dep in platform.registry.deployments.items.items()
            for svc in dep.manifest.services for fn in svc.functions if fn.openai]


def largest_limit(platform: Platform) -> int:
    """The most any served model takes (``binary.body_limit``: its ``max_body_bytes``, else the platform's default,
    within the platform's cap); the platform's default when none is served."""
    return max((body_limit(platform, fn) for _, fn in _openai_functions(platform)),
               default=platform.settings.max_body_bytes)


async def _first(stream: CallStream) -> tuple[list[msgspec.Raw] | None]:
    await stream.start()
    return (await stream.next_items(),)


async def _collected(pieces: AsyncIterator[list[str]]) -> bool:
    """Read ``pieces`` to their end (the shaper keeps the text): True, as the whole answer is ready."""
    async for _ in pieces:
        pass
    return True


async def _pieces(stream: CallStream, first: list[msgspec.Raw] | None, shaper: Shaper,
                  timer: LlmTimer) -> AsyncIterator[list[str]]:
    """The text to send as it comes, the pieces of each message from the replica together (those of one step, or
    what a generator gave while the last went out), until the model ends or the shaper does (then the stream is
    closed)."""
    items = first
    while items is not None:
        texts = []
        for raw in items:
            try:
                piece = _str.decode(raw)
            except msgspec.ValidationError:
                raise not_text(msgspec.json.decode(raw)) from None
            timer.piece()
            text = shaper.add(piece)
            if text:
                texts.append(text)
            if shaper.finish is not None:
                break
        if shaper.finish is not None:
            if texts:
                yield texts
            await stream.aclose()
            return
        if texts:
            yield texts
        items = await stream.next_items()
    rest = shaper.end()
    if rest:
        yield [rest]


async def _events(stream: CallStream, pieces: AsyncIterator[list[str]], answer: Format, shaper: Shaper,
                  usage: bool, held: Any, timer: LlmTimer) -> AsyncIterator[bytes]:
    """The SSE events: one chunk per piece, those of one message from the replica written together."""
    try:
        yield answer.opening()
        try:
            async for texts in pieces:
                yield b"".join(map(answer.chunk, texts))
        except EmberError as exc:
            yield error_event(exc)
            return
        yield answer.chunk(None, shaper.finish or "stop")
        if usage:
            yield answer.usage_chunk(shaper)
        yield b"data: [DONE]\n\n"
    finally:
        await _done(stream, held, timer)


async def _done(stream: CallStream, held: Any, timer: LlmTimer) -> None:
    if held is not None:  # before any await: a cancel there would leave the slot held for good
        held.release()
    timer.done()
    await stream.aclose()

