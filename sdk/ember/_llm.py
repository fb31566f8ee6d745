"""Language models: ``openai="NAME"`` on a generator, and ``ember.Continuous`` steps over ``ember.Sequence``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import msgspec

from ember._errors import InvalidSpecError
from ember._types import CallIO
from ember.wire import Continuous, FunctionSpec
from ember.wire.openai import MODEL_NAME, ChatRequest, CompletionRequest, EmbeddingRequest, Request


class Sequence:
    """One request under continuous batching, as the step sees it.

    Attributes:
        request: the ``ember.openai.ChatRequest`` or ``CompletionRequest`` it came with.
        pieces: the text pieces generated so far, in order.
        state: the user's own per-sequence data (a KV cache, token ids...); None until the step sets it.
        cancelled: its caller went away; it leaves the running set before the next step.
        call_id: the call it answers.
        done: it left the running set (it ended, or its caller went away): no step sees it again, and what it held
            (a slot of a preallocated KV cache, say) may be reused.
    """

    __slots__ = ("call_id", "cancelled", "done", "pieces", "request", "state")

    def __init__(self, request: Request, call_id: str = "") -> None:
        self.request = request
        self.call_id = call_id
        self.pieces: list[str] = []
        self.state: Any = None
        self.cancelled = False
        self.done = False

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self.pieces)

    def __repr__(self) -> str:
        return f"<ember.Sequence {self.call_id or '?'}: {len(self.pieces)} pieces>"


def check_openai(where: str, name: Any) -> str:
    """``openai=``: a model name, or None (not served on /openai/v1)."""
    if name is None:
        return ""
    if not isinstance(name, str) or not re.fullmatch(MODEL_NAME, name):
        raise InvalidSpecError(f"{where}(openai={name!r}): a model name is 1 to 128 letters, digits and '._:/@+-', "
                               "starting with a letter or digit, e.g. openai=\"tiny-gpt\"")
    return name


def check_openai_io(where: str, raw: Callable[..., Any], openai: str, io: CallIO) -> None:
    """``openai=`` serves a generator of text pieces (chat and completions) or a function of one
    ``EmbeddingRequest`` (embeddings; batched, of a list of them); ``InvalidSpecError`` for anything else."""
    if not openai or io.stream or (io.mode == "single" and io.input_type is EmbeddingRequest):
        return
    raise InvalidSpecError(f"{where}(openai={openai!r}) on {raw.__qualname__}(): a model served on /openai/v1 is a "
                           "generator of text pieces (`def f(req: ember.openai.ChatRequest) -> Iterator[str]`), a "
                           "step under batch=ember.Continuous(...), or a function of an embeddings request (`def "
                           "f(req: ember.openai.EmbeddingRequest) -> list[list[float]]`)")


def continuous_spec(where: str, name: str, raw: Callable[..., Any], batch: Continuous, openai: str,
                    is_method: bool) -> FunctionSpec:
    """The spec of a Continuous step: it streams, runs on the replica's loop (the step itself on a thread), takes a
    chat or completion request per call, and runs ``max_seqs`` sequences at once."""
    if inspect.isgeneratorfunction(raw) or inspect.isasyncgenfunction(raw) or inspect.iscoroutinefunction(raw):
        raise InvalidSpecError(f"{where}(batch=ember.Continuous(...)) on {raw.__qualname__}(): a step is a plain "
                               "function `def step(self, seqs: list[ember.Sequence]) -> list[str | None]`")
    params = list(inspect.signature(raw).parameters)[1 if is_method else 0:]
    if len(params) != 1:
        raise InvalidSpecError(f"{where}(batch=ember.Continuous(...)) on {raw.__qualname__}(): a step takes one "
                               f"parameter, the running sequences; it has {len(params)}")
    (chat, completion), defs = msgspec.json.schema_components([ChatRequest, CompletionRequest],
                                                              ref_template="#/$defs/{name}")
    schema = {"anyOf": [chat, completion], "$defs": defs}
    return FunctionSpec(name=name, attr=raw.__name__, input_mode="single", params=["request"], input_schema=schema,
                        output_schema={"type": "string"}, stream=True, is_async=True,
                        max_concurrency=batch.max_seqs, openai=openai, continuous=batch)


def continuous_io() -> CallIO:
    """How a Continuous step is called: with one request, streaming text pieces."""
    signature = inspect.Signature([inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    io = CallIO("single", Any, str, ["request"], signature)
    io.stream = True
    return io


_chat = msgspec.json.Decoder(ChatRequest)
_completion = msgspec.json.Decoder(CompletionRequest)


def decode_request(body: bytes) -> Request:
    """A Continuous step's call input: a chat request (it has ``messages``) or a completion request."""
    head = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    return (_chat if "messages" in head else _completion).decode(body)
