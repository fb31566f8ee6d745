"""OpenAI-compatible serving: the request types a function with ``openai="NAME"`` receives: a generator of text
pieces serves chat and completions, a plain function embeddings.

Example:
    >>> @app.function(openai="echo-chat")
    ... def echo(req: ember.openai.ChatRequest) -> Iterator[str]:
    ...     for word in req.messages[-1].content.split():
    ...         yield word + " "
    >>> @app.function(openai="word-stats")
    ... def embed(req: ember.openai.EmbeddingRequest) -> list[list[float]]:
    ...     return [[len(text), text.count(" ")] for text in req.texts]

Any OpenAI client then calls it: ``openai.OpenAI(base_url=f"{EMBER_URL}/openai/v1", api_key=EMBER_TOKEN)``.
"""

from ember.wire.openai import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Message,
    Request,
    StreamOptions,
    Usage,
)

__all__ = ["ChatRequest", "CompletionRequest", "EmbeddingRequest", "Message", "Request", "StreamOptions", "Usage"]
