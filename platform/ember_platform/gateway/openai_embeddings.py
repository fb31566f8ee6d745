"""``POST /openai/v1/embeddings``: a function with ``openai="NAME"`` that is not a generator, called with the request
(checked here as the other OpenAI routes check theirs, within the model's body limit and its app's quotas) and
answered in OpenAI's shape: one vector per input text, in their order, as floats or (``encoding_format: "base64"``,
what OpenAI's Python client asks for by default) as their float32 bytes, little-endian, in base64."""

from __future__ import annotations

import base64
import os
import struct
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import RemoteError
from ember.wire.errors import error_from_info
from ember.wire.openai import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from ember_platform.auth.scopes import INVOKE
from ember_platform.gateway import calls
from ember_platform.gateway.guard import checks_itself
from ember_platform.gateway.metrics import CALLED
from ember_platform.gateway.openai_api import admitted, openai_errors
from ember_platform.gateway.responses import platform_of

_encoder = msgspec.json.Encoder()
_vectors = msgspec.json.Decoder(list[list[float]])


@checks_itself(INVOKE)
@openai_errors
async def embeddings(request: Request) -> Response:
    """``POST /openai/v1/embeddings``."""
    platform = platform_of(request)
    req: EmbeddingRequest
    req, dep, svc, fn, token = await admitted(request, "embedding")
    request.scope[CALLED] = (dep.app, fn.name, dep.version)  # what GET /metrics counts this call under
    held = platform.quotas.limiter.admit(dep.app, token)
    call_id = os.urandom(16).hex()
    try:
        call = platform.router.call(dep.app, fn.name, dep.version, _encoder.encode(req), call_id=call_id,
                                    deadline=time.time() + svc.timeout_s)
        reply = await calls._unless_disconnected(request, call)
    finally:
        if held is not None:
            held.release()
    if reply is None:
        return Response(status_code=499)  # the client is gone
    if reply.error is not None:
        raise error_from_info(reply.error)
    answer = EmbeddingList(data=[Embedding(index=i, embedding=_encoded(v, req.encoding_format))
                                 for i, v in enumerate(_of(reply.output, len(req.texts)))],
                           model=req.model, usage=_usage(req))
    return Response(_encoder.encode(answer), media_type="application/json", headers={"X-Ember-Call-Id": call_id})


def _of(output: Any, texts: int) -> list[list[float]]:
    """The model's vectors, one per text: a ``RemoteError`` (the model's fault, a 500) for anything else."""
    try:
        vectors = _vectors.decode(bytes(output))
    except msgspec.ValidationError as exc:
        raise RemoteError(f"the model gave no list of vectors of numbers ({exc})", remote_type="TypeError") from None
    if len(vectors) != texts:
        raise RemoteError(f"the model gave {len(vectors)} vectors for {texts} texts", remote_type="ValueError")
    return vectors


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    try:
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    except OverflowError:
        raise RemoteError("the model gave a number beyond float32's range, which base64 embeddings hold",
                          remote_type="OverflowError") from None


def _usage(req: EmbeddingRequest) -> EmbeddingUsage:
    words = sum(len(text.split()) for text in req.texts)
    return EmbeddingUsage(prompt_tokens=words, total_tokens=words)
