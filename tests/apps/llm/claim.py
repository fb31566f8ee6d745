"""A test subject: an app serving a model whose name other apps ask for too (tests rename both)."""

from collections.abc import Iterator

import ember

app = ember.App("llm-claim")


@app.function(openai="claimed", min_replicas=0)
def echo(req: ember.openai.ChatRequest) -> Iterator[str]:
    yield "claimed"
