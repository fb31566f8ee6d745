"""The Ember side of bench/per_call.py: echo (unbatched), and the MLP of mlp.py batched and unbatched, each
its own replica."""

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
