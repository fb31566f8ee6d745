"""The text of an OpenAI-compatible answer, as the platform enforces it: ``max_tokens`` and ``stop`` whatever the
model does, and the answers, chunks and errors in OpenAI's shapes."""

from __future__ import annotations

import math
import time

import msgspec
from starlette.responses import Response

from ember._errors import EmberError, NotFoundError, PayloadTooLargeError, RemoteError
from ember.wire.openai import (
    AnswerMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ErrorAnswer,
    ErrorDetail,
    FinishReason,
    Request,
    Usage,
)
from ember_platform.auth.tokens import TokenRefused
from ember_platform.gateway.streaming import MAX_COLLECTED_BYTES

_encoder = msgspec.json.Encoder()
_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


class Shaper:
    """Cuts the generated text at ``limit`` pieces or at the first stop string (which is not shown). Streaming, it
    holds back the last few characters that could begin a stop string, so that no part of one is ever sent.

    It keeps only that unsent tail, so each piece costs its own length whatever came before; an answer given whole
    (``collect``) keeps its parts too, to ``MAX_COLLECTED_BYTES``."""

    def __init__(self, limit: int, stops: list[str], *, collect: bool = False) -> None:
        self.limit = limit
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""  # text not given out yet: at most ``hold`` characters between pieces
        self.collect = collect
        self.parts: list[str] = []  # what was given out, where collected
        self.size = 0  # its bytes (UTF-8)
        self.pieces = 0
        self.finish: FinishReason | None = None

    @property
    def text(self) -> str:
        """The answer given out so far (collected answers only)."""
        return "".join(self.parts)

    def add(self, piece: str) -> str:
        """Take one piece; the text that may go out now (set ``finish`` once the answer is complete)."""
        self.pieces += 1
        before = len(self.pending)  # a stop string may begin in these, never in what went out
        self.pending += piece
        cut = min((i for stop in self.stops if (i := self.pending.find(stop, max(0, before - len(stop) + 1))) >= 0),
                  default=-1)
        if cut >= 0:
            self.pending = self.pending[:cut]
            self.finish = "stop"
        elif self.pieces >= self.limit:
            self.finish = "length"
        if self.finish is not None:
            return self.flush()
        safe = len(self.pending) - self.hold
        if safe <= 0:
            return ""
        out, self.pending = self.pending[:safe], self.pending[safe:]
        return self._given(out)

    def end(self) -> str:
        """The model stopped by itself: the rest of the text."""
        self.finish = self.finish or "stop"
        return self.flush()

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return self._given(out)

    def _given(self, out: str) -> str:
        if self.collect and out:
            self.size += len(out.encode())
            if self.size > MAX_COLLECTED_BYTES:
                raise PayloadTooLargeError(f"the answer is over {MAX_COLLECTED_BYTES} bytes, the most given whole; "
                                           "ask for it with stream=true", field="stream")
            self.parts.append(out)
        return out


def prompt_tokens(request: Request) -> int:
    return len(request.text().split())


def usage(request: Request, shaper: Shaper) -> Usage:
    prompt = prompt_tokens(request)
    return Usage(prompt_tokens=prompt, completion_tokens=shaper.pieces, total_tokens=prompt + shaper.pieces)


class Format:
    """One answer's shapes: ``chat`` (chat.completion and its chunks) or a text completion."""

    def __init__(self, kind: str, call_id: str, model: str, request: Request) -> None:
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + call_id
        self.created = int(time.time())
        self.model = model
        self.request = request
        # a completion with echo: its prompt before the generated text, as OpenAI and vLLM give it
        self.echo = request.text() if isinstance(request, CompletionRequest) and request.echo else ""

    def whole(self, shaper: Shaper) -> bytes:
        finish = shaper.finish or "stop"
        if self.chat:
            return _encoder.encode(ChatCompletion(
                id=self.id, created=self.created, model=self.model, usage=usage(self.request, shaper),
                choices=[ChatChoice(message=AnswerMessage(content=shaper.text), finish_reason=finish)]))
        return _encoder.encode(Completion(id=self.id, created=self.created, model=self.model,
                                          usage=usage(self.request, shaper),
                                          choices=[CompletionChoice(text=self.echo + shaper.text,
                                                                    finish_reason=finish)]))

    def opening(self) -> bytes:
        """The event before the first piece: a chat's role, a completion's echoed prompt (nothing otherwise)."""
        if self.chat:
            return self.chunk("", role=True)
        return self.chunk(self.echo) if self.echo else b""

    def chunk(self, text: str | None, finish: FinishReason | None = None, *, role: bool = False) -> bytes:
        """One ``data:`` event carrying ``text`` (None: none), and the finish reason on the last."""
        if self.chat:
            delta = Delta(role="assistant" if role else None, content=text)
            body = _encoder.encode(ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                                       choices=[ChunkChoice(delta=delta, finish_reason=finish)]))
        else:
            body = _encoder.encode(Completion(id=self.id, created=self.created, model=self.model,
                                              choices=[CompletionChoice(text=text or "", finish_reason=finish)]))
        return b"data: " + body + b"\n\n"

    def usage_chunk(self, shaper: Shaper) -> bytes:
        used = usage(self.request, shaper)
        if self.chat:
            body = _encoder.encode(ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                                       choices=[], usage=used))
        else:
            body = _encoder.encode(Completion(id=self.id, created=self.created, model=self.model, choices=[],
                                              usage=used))
        return b"data: " + body + b"\n\n"


def error_detail(exc: EmberError) -> ErrorDetail:
    status = exc.http_status
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    code = "model_not_found" if isinstance(exc, NotFoundError) and exc.field == "model" else exc.code
    param = exc.field.removeprefix("$.") if exc.field else None
    return ErrorDetail(message=str(exc), type=kind, param=param or None, code=code)


def error_response(exc: EmberError) -> Response:
    """OpenAI's error body, with the status of Ember's error (and its ``Retry-After`` and ``WWW-Authenticate``)."""
    response = Response(_encoder.encode(ErrorAnswer(error=error_detail(exc))), status_code=exc.http_status,
                        media_type="application/json")
    if exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, TokenRefused):
        response.headers["WWW-Authenticate"] = exc.challenge
    return response


def error_event(exc: EmberError) -> bytes:
    """A stream that fails after its first piece: an ``error`` event as vLLM sends it, then ``[DONE]``."""
    return b"data: " + _encoder.encode(ErrorAnswer(error=error_detail(exc))) + b"\n\ndata: [DONE]\n\n"


def not_text(piece: object) -> RemoteError:
    return RemoteError(f"the model gave a {type(piece).__name__}, not a text piece (a str)", remote_type="TypeError")
