"""A torch digits classifier served with batching: `ember push examples/digits/classifier.py`.

Weights are produced offline by `train.py` (scikit-learn's bundled digits data) and loaded from a file.
"""

from pathlib import Path

from schema import Image, Prediction

import ember

app = ember.App("digits")
WEIGHTS = Path(__file__).resolve().parent / "weights.pt"


@app.model(min_replicas=1, timeout_s=30)
class Classifier:
    @ember.setup
    def load(self) -> None:
        import torch
        from model import load

        torch.set_num_threads(1)
        self.torch = torch
        self.net = load(WEIGHTS)

    @ember.method(batch=ember.Batch(max_size=32, window_ms=5))
    def predict(self, images: list[Image]) -> list[Prediction]:
        torch = self.torch
        with torch.inference_mode():
            x = torch.tensor([image.pixels for image in images], dtype=torch.float32)
            probs = torch.softmax(self.net(x), dim=1)
            confidence, label = probs.max(dim=1)
        return [Prediction(label=int(lbl), confidence=round(float(c), 4))
                for lbl, c in zip(label.tolist(), confidence.tolist(), strict=True)]
