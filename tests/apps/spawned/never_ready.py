"""A model whose setup never ends: no replica of it becomes ready, and calls of it fail ``unavailable``."""

import time

import ember

app = ember.App("never-ready")


@app.model(timeout_s=60)
class Sleeper:
    @ember.setup
    def load(self) -> None:
        time.sleep(600)

    @ember.method()
    def ping(self) -> str:
        return "pong"
