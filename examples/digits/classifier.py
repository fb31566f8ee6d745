"""A torch digits classifier served with batching: `ember push examples/digits/classifier.py`.

Weights are produced offline by `train.py` (scikit-learn's bundled digits data) and read from the
`digits-weights` volume, mounted read-only at `/weights` (put it first: `ember volume put digits-weights
examples/digits/weights.pt`). The weights are loaded once per node, in a zygote (`@ember.setup(snap=True)`);
each replica forked from it moves them to its own device. (On a node that sandboxes its replicas, a replica
given a GPU forks only from a zygote whose sandbox holds that GPU; one given another runs both setups itself.)
`ember.backends.torch` places the model on the replica's device (`EMBER_DEVICE`: the CPU, or the GPU the node
gave it), stacks each batch onto that device and warms up at the batch sizes the replica will see.
"""

from pathlib import Path

from schema import Image, Prediction

import ember
from ember.backends import torch as et

app = ember.App("digits")
WEIGHTS = ember.Volume("digits-weights")  # `ember volume put digits-weights examples/digits/weights.pt`
BATCH = ember.Batch(max_size=32, window_ms=5)


@app.model(min_replicas=1, timeout_s=30, volumes={"/weights": WEIGHTS})
class Classifier:
    @ember.setup(snap=True)
    def load(self) -> None:
        """Once per node, in the zygote that replicas fork from: imports and weights, in host memory (and
        warmed up there: a replica on the CPU inherits it warm)."""
        import torch
        from model import DigitsNet

        torch.set_num_threads(1)
        self.net = et.load_module(DigitsNet, Path(ember.mounted("/weights")) / "weights.pt", device="cpu")
        self._warm_up()

    @ember.setup
    def to_device(self) -> None:
        """In each replica: onto the device it was given, warmed up there if that is a GPU."""
        if ember.backends.device() != "cpu":
            self.net = et.load_module(self.net)
            self._warm_up()

    def _warm_up(self) -> None:
        et.warm_up(self._classify, Image(pixels=[0.0] * 64), sizes=(1, BATCH.max_size))

    @ember.method(batch=BATCH)
    def predict(self, images: list[Image]) -> list[Prediction]:
        return self._classify(images)

    def _classify(self, images: list[Image]) -> list[Prediction]:
        with et.inference():
            x, n = et.stack([image.pixels for image in images], dtype="float32")
            confidence, label = self.net(x).softmax(dim=1).max(dim=1)
        return [Prediction(label=int(lbl), confidence=round(float(c), 4))
                for lbl, c in zip(et.unstack(label, n, tolist=True), et.unstack(confidence, n, tolist=True),
                                  strict=True)]
