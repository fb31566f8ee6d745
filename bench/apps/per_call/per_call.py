"""The Ember side of bench/per_call.py: echo (unbatched), and the MLP of mlp.py batched and unbatched, each
its own replica; and the batched MLP once more as a function bound to a NATS subject (queued calls from events)."""

from mlp import Mlp, Prediction, Vector

import ember

app = ember.App("percall")


@app.function()
def echo(item: dict) -> dict:
    return item


@app.model(min_replicas=1, timeout_s=30)
class Batched:
    @ember.setup
    def load(self) -> None:
        self.mlp = Mlp()

    @ember.method(batch=ember.Batch(max_size=32, window_ms=5))
    def predict(self, vectors: list[Vector]) -> list[Prediction]:
        return self.mlp.classify(vectors)


@app.model(min_replicas=1, timeout_s=30)
class Unbatched:
    @ember.setup
    def load(self) -> None:
        self.mlp = Mlp()

    @ember.method
    def predict(self, vector: Vector) -> Prediction:
        return self.mlp.classify([vector])[0]


_MODEL: list[Mlp] = []  # the events function's model, made on its first batch


@app.function(batch=ember.Batch(max_size=32, window_ms=5), on="events.percall.vectors",
              result_subject="events.percall.predictions", timeout_s=30)
def on_vectors(vectors: list[Vector]) -> list[Prediction]:
    """``Batched.predict`` again, invoked by events: each message published to ``events.percall.vectors`` is a call."""
    if not _MODEL:
        _MODEL.append(Mlp())
    return _MODEL[0].classify(vectors)
