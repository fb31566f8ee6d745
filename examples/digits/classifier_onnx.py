"""The same digits model served through ONNX Runtime: `ember push examples/digits/classifier_onnx.py`.

`ember.backends.onnx.session` opens the model on the replica's device (`EMBER_DEVICE`) and refuses to
start a GPU replica whose session silently fell back to the CPU.
"""

from pathlib import Path

from schema import Image, Prediction

import ember
from ember.backends import onnx as eo

app = ember.App("digits-onnx")
MODEL = Path(__file__).resolve().parent / "digits.onnx"


@app.model(min_replicas=1, timeout_s=30)
class Classifier:
    @ember.setup
    def load(self) -> None:
        import numpy as np

        self.np = np
        self.session = eo.session(MODEL, intra_op_threads=1)

    @ember.method(batch=ember.Batch(max_size=32, window_ms=5))
    def predict(self, images: list[Image]) -> list[Prediction]:
        np = self.np
        x = np.asarray([image.pixels for image in images], dtype=np.float32)
        logits = eo.run(self.session, {"pixels": x})["logits"]
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        return [Prediction(label=int(p.argmax()), confidence=round(float(p.max()), 4)) for p in probs]
