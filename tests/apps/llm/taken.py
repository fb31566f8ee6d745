"""A test subject: an app that asks for a model name another app already serves (a push of it is a 409)."""

from collections.abc import Iterator

import ember

app = ember.App("llm-taken")


@app.function(openai="echo-words")
def echo(req: ember.openai.ChatRequest) -> Iterator[str]:
    yield "mine"
