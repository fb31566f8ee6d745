"""OpenAI-compatible serving: the request types a function with ``openai="NAME"`` receives.

Example:
    >>> @app.function(openai="echo-chat")
    ... def echo(req: ember.openai.ChatRequest) -> Iterator[str]:
    ...     for word in req.messages[-1].content.split():
    ...         yield word + " "

Any OpenAI client then calls it: ``openai.OpenAI(base_url=f"{EMBER_URL}/openai/v1", api_key=EMBER_TOKEN)``.
"""

from ember.wire.openai import ChatRequest, CompletionRequest, Message, Request, StreamOptions, Usage

__all__ = ["ChatRequest", "CompletionRequest", "Message", "Request", "StreamOptions", "Usage"]
