"""The OpenAI-compatible routes in the OpenAPI document (``openapi``): their bodies and entries, in the shape of
``openapi._OPERATIONS``. Their errors are OpenAI's, ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from ember.wire.openai import (
    MODEL_NAME,
    ChatBody,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ErrorAnswer,
    Model,
    ModelList,
)

JSON = "application/json"
SSE = "text/event-stream"
BODIES: dict[str, Any] = {
    "ChatRequest": ChatBody, "CompletionRequest": CompletionRequest, "ChatCompletion": ChatCompletion,
    "ChatCompletionChunk": ChatCompletionChunk, "Completion": Completion, "Model": Model, "ModelList": ModelList,
    "EmbeddingRequest": EmbeddingRequest, "EmbeddingList": EmbeddingList, "OpenAIError": ErrorAnswer,
}
PATH_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "model_id": ("a model's name (openai= of the function that serves it)",
                 {"type": "string", "pattern": f"^(?:{MODEL_NAME})$"}),
}
_ERRORS = (400, 401, 404, 413, 422, 429, 500, 503, 504)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": _ref(name)}}}


def _events(chunk: str) -> dict[str, Any]:
    """``stream: true``: Server-Sent Events, each ``data: <chunk>``, the last ``data: [DONE]``."""
    return {SSE: {"schema": {
        "type": "object", "required": ["data"], "description": f"Server-Sent Events: each data is a {chunk} (as "
        "JSON), or an OpenAIError if the model fails after its first piece; the last is [DONE]",
        "properties": {"data": {"type": "string"}}}}}


OPERATIONS: dict[tuple[str, str], Any] = {
    ("POST", "/openai/v1/chat/completions"): (
        "OpenAI-compatible chat completion (`stream: true`: Server-Sent Events of chat.completion.chunk); the token "
        "needs invoke on the model's app; max_tokens and stop are enforced by the platform; n is 1",
        (200, "the completion", _ref("ChatCompletion"), JSON), _ERRORS, [], _body("ChatRequest")),
    ("POST", "/openai/v1/completions"): (
        "OpenAI-compatible text completion (`stream: true`: Server-Sent Events of text_completion chunks)",
        (200, "the completion", _ref("Completion"), JSON), _ERRORS, [], _body("CompletionRequest")),
    ("POST", "/openai/v1/embeddings"): (
        "OpenAI-compatible embeddings: one vector per input text, as floats or (encoding_format base64) their "
        "float32 bytes, little-endian, in base64; the model is a function of an embeddings request, not a generator",
        (200, "the embeddings", _ref("EmbeddingList"), JSON), _ERRORS, [], _body("EmbeddingRequest")),
    ("GET", "/openai/v1/models"): ("OpenAI-compatible: the models this token may invoke",
                                   (200, "the models", _ref("ModelList"), JSON), (), [], None),
    ("GET", "/openai/v1/models/{model_id:rest}"): ("OpenAI-compatible: one model this token may invoke",
                                                   (200, "the model", _ref("Model"), JSON), (404,), [], None),
}
STREAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/openai/v1/chat/completions"): _events("ChatCompletionChunk"),
    ("POST", "/openai/v1/completions"): _events("Completion"),
}
