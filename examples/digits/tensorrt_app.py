"""The digits model as a TensorRT engine built on the node: `ember push examples/digits/tensorrt_app.py`.

An example only (the demo does not deploy it): it needs a GPU with TensorRT 10 and the CUDA build of
torch. Engines are specific to the GPU model and TensorRT version, so setup builds one from `digits.onnx`
on first use and caches it in the temp directory (`ember.backends.tensorrt.cached_engine`); nothing built
is committed or bundled. tensorrt is imported only in setup, so `ember push` reads this app anywhere.
"""

from pathlib import Path

from schema import Image, Prediction

import ember
from ember.backends import tensorrt as etrt
from ember.backends import warm_up

app = ember.App("digits-trt")
MODEL = Path(__file__).resolve().parent / "digits.onnx"
BATCH = ember.Batch(max_size=32, window_ms=5)


@app.model(gpu=1, min_replicas=1, timeout_s=30)
class Classifier:
    @ember.setup
    def load(self) -> None:
        import numpy as np

        self.np = np
        self.engine = etrt.Engine(etrt.cached_engine(MODEL, max_batch=BATCH.max_size))
        warm_up(self._classify, Image(pixels=[0.0] * 64), sizes=self.engine.optimization_profile_batch_sizes())

    @ember.method(batch=BATCH)
    def predict(self, images: list[Image]) -> list[Prediction]:
        return self._classify(images)

    def _classify(self, images: list[Image]) -> list[Prediction]:
        np = self.np
        x = np.asarray([image.pixels for image in images], dtype=np.float32)
        logits = self.engine.infer({"pixels": x})["logits"]
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        return [Prediction(label=int(p.argmax()), confidence=round(float(p.max()), 4)) for p in probs]
