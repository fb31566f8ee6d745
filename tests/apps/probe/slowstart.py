"""A model whose setup takes far longer than a call's deadline: calls get 503 while it starts."""

import time

import ember

app = ember.App("slowstart")


@app.model(timeout_s=60)
class Sleeper:
    @ember.setup
    def load(self) -> None:
        time.sleep(600)

    @ember.method()
    def ping(self) -> str:
        return "pong"
