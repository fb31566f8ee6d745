"""An ONNX image classifier whose weights come from a volume, not from the bundle.

    python examples/onnx_classifier/export.py /tmp/shapes           # the model file
    ember volume put shapes-onnx /tmp/shapes/shapes.onnx             # into a volume (before the push)
    ember dev examples/onnx_classifier/app.py
    PIXELS=$(python examples/onnx_classifier/export.py --sample vertical)      # a picture of a vertical bar
    ember call onnx-classifier.Classifier.predict --data "{\"pixels\": $PIXELS}"

The volume is mounted read-only at ``/weights`` in each replica; ``setup`` opens the model once per replica (with
``snap=True`` its zygote does, and replicas fork from it), and the batched ``predict`` runs a batch of images in one
ONNX Runtime call.
"""

from pathlib import Path

import msgspec

import ember
from ember.backends import onnx as eo

app = ember.App("onnx-classifier")
LABELS = ["vertical", "horizontal", "diagonal", "square"]  # the order export.py gives the model's outputs


class Picture(msgspec.Struct):
    pixels: list[list[float]]  # 8 rows of 8 grey levels, 0 to 1


class Prediction(msgspec.Struct):
    label: str
    confidence: float


@app.model(volumes={"/weights": ember.Volume("shapes-onnx")}, timeout_s=30)
class Classifier:
    @ember.setup
    def load(self) -> None:
        import numpy as np

        self.np = np
        self.session = eo.session(Path(ember.mounted("/weights")) / "shapes.onnx", intra_op_threads=1)

    @ember.method(batch=ember.Batch(max_size=32, window_ms=5))
    def predict(self, pictures: list[Picture]) -> list[Prediction]:
        if any(len(p.pixels) != 8 or any(len(row) != 8 for row in p.pixels) for p in pictures):
            raise ember.InvalidInputError("pixels must be 8 rows of 8 numbers", field="pixels")
        x = self.np.asarray([p.pixels for p in pictures], dtype=self.np.float32)
        probs = eo.run(self.session, {"images": x})["probs"]
        return [Prediction(label=LABELS[int(p.argmax())], confidence=round(float(p.max()), 4)) for p in probs]
