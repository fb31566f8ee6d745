"""OpenAI's API, as far as Ember serves it: the requests of ``/openai/v1/chat/completions``,
``/openai/v1/completions`` and ``/openai/v1/embeddings`` (what a function with ``openai="NAME"`` receives), and the
answers, chunks and errors the gateway sends back.

The requests are decoded with their bounds (msgspec constraints, also shown by ``/openapi.json``): a field out of
them is an OpenAI-shaped 422 naming it. Fields OpenAI has and Ember does not read (``logprobs``, ``tools``, ...) are
accepted and passed on in ``extra``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ember.wire import subjects

MAX_TOKENS = 32_768  # the most tokens one request may ask for (a larger max_tokens is a 422 naming it)
MAX_MESSAGES = 1024
MAX_TEXT_CHARS = 1_048_576  # one message's content, or a prompt
MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 256
MAX_EXTRA_FIELDS = 64
MAX_CONTENT_PARTS = 256  # the text parts of one message's content
DEFAULT_CHAT_MAX_TOKENS = 4096  # a chat request without max_tokens or max_completion_tokens
DEFAULT_COMPLETION_MAX_TOKENS = 16  # a completion request without max_tokens (OpenAI's default)
MODEL_NAME = subjects.MODEL_NAME  # a served model's name (openai="...")

MAX_EMBEDDING_INPUTS = 2048  # texts one embeddings request may hold (as OpenAI)
MAX_DIMENSIONS = 65_536

Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
SomeText = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
Stop = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS, description=f"at most {MAX_TOKENS}")]
ModelName = Annotated[str, Meta(min_length=1, max_length=256, description="a model that GET /openai/v1/models lists")]
Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a chat: ``role`` and its text ``content``."""

    role: Role
    content: Text = ""
    name: Annotated[str, Meta(max_length=256)] | None = None


class TextPart(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text"):
    """A part of a message's content as OpenAI's clients send it, ``{"type": "text", "text": ...}``: only text is
    served (an image or audio part is a 422 naming its ``type``)."""

    text: Text


class SentMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A chat message as clients send it: its ``content`` a string, a list of text parts, or null (an assistant's
    message that called tools); the model receives it as a ``Message`` whose content is ``text()``."""

    role: Role
    content: Text | Annotated[list[TextPart], Meta(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Annotated[str, Meta(max_length=256)] | None = None

    def text(self) -> str:
        """The content as one string: text parts joined by newlines (as vLLM joins them), null as empty."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


class _Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """The fields both requests share."""

    model: ModelName
    max_tokens: Tokens | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    stop: Stop | Annotated[list[Stop], Meta(max_length=MAX_STOPS)] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # a 64-bit seed (a larger one broke engines)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=1, description="1 only: one choice per request")] = 1
    user: Annotated[str, Meta(max_length=256)] | None = None
    extra: dict[str, Any] = {}  # the request's other fields, as sent (for the model's own sampling parameters)

    @property
    def stops(self) -> list[str]:
        """``stop`` as a list (empty: none)."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(_Sampling, frozen=True, kw_only=True):
    """A request of ``POST /openai/v1/chat/completions``.

    Example:
        >>> @app.function(openai="echo-chat")
        ... def echo(req: ember.openai.ChatRequest) -> Iterator[str]:
        ...     yield from req.messages[-1].content.split()
    """

    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Tokens | None = None

    @property
    def limit(self) -> int:
        """The most pieces to generate: ``max_completion_tokens``, else ``max_tokens``, else the default."""
        return self.max_completion_tokens or self.max_tokens or DEFAULT_CHAT_MAX_TOKENS

    def text(self) -> str:
        """The messages' contents, one per line (a prompt for a model without a chat template)."""
        return "\n".join(m.content for m in self.messages)


class CompletionRequest(_Sampling, frozen=True, kw_only=True):
    """A request of ``POST /openai/v1/completions``."""

    prompt: Text | Annotated[list[Text], Meta(min_length=1, max_length=1, description="one prompt")]
    echo: bool = False

    @property
    def limit(self) -> int:
        return self.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatBody(_Sampling, frozen=True, kw_only=True):
    """What ``POST /openai/v1/chat/completions`` accepts: a ``ChatRequest`` whose messages may hold their content as
    text parts or null (``SentMessage``); the gateway turns it into the ``ChatRequest`` a model receives."""

    messages: Annotated[list[SentMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Tokens | None = None


Request = ChatRequest | CompletionRequest


class EmbeddingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A request of ``POST /openai/v1/embeddings``: what a function with ``openai="NAME"`` that is not a generator
    receives; it returns one vector per text of ``texts``, in their order.

    Example:
        >>> @app.function(openai="word-stats", batch=ember.Batch(max_size=16))
        ... def embed(reqs: list[ember.openai.EmbeddingRequest]) -> list[list[list[float]]]:
        ...     return [[[len(t), t.count(" ")] for t in req.texts] for req in reqs]
    """

    model: ModelName
    input: SomeText | Annotated[list[SomeText], Meta(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)] | None = None  # for a model that can shorten its own
    user: Annotated[str, Meta(max_length=256)] | None = None
    extra: dict[str, Any] = {}  # the request's other fields, as sent

    @property
    def texts(self) -> list[str]:
        """``input`` as a list of texts."""
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingUsage(msgspec.Struct, frozen=True, kw_only=True):
    """``prompt_tokens`` counts the texts' whitespace-separated words (as for completions)."""

    prompt_tokens: int
    total_tokens: int


class Embedding(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # floats, or (encoding_format "base64") their float32 bytes, little-endian, base64


class EmbeddingList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
FinishReason = Literal["stop", "length"]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """``completion_tokens`` counts the pieces generated (one per item of the generator or per step);
    ``prompt_tokens`` the prompt's whitespace-separated words."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AnswerMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str = ""


class ChatChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    message: AnswerMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One ``data:`` event of a streamed chat completion (the last one, with ``include_usage``, has no choices)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(msgspec.Struct, frozen=True, kw_only=True):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """A completion, and (``stream: true``) each ``data:`` event of one."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Model(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str  # the app that serves it


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    type: str  # invalid_request_error, authentication_error, permission_error, rate_limit_error, server_error
    param: str | None = None
    code: str | None = None


class ErrorAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's error body."""

    error: ErrorDetail
