"""The model of bench/per_call.py: an MLP 256 -> 1024 -> 1024 -> 10 on one torch thread, the same weights in
every process (seeded). Imported by the Ember app (per_call.py) and by the bench's bare endpoint alike."""

from __future__ import annotations

from typing import Any

import msgspec

WIDTH_IN, HIDDEN, CLASSES = 256, 1024, 10
SEED = 0


class Vector(msgspec.Struct, frozen=True):
    values: list[float]


class Prediction(msgspec.Struct, frozen=True):
    label: int
    confidence: float


class Mlp:
    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            self.net: Any = torch.nn.Sequential(
                torch.nn.Linear(WIDTH_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)).eval()
        self._torch = torch
        for n in (1, 32):
            self.classify([Vector(values=[0.0] * WIDTH_IN)] * n)

    def classify(self, vectors: list[Vector]) -> list[Prediction]:
        torch = self._torch
        with torch.inference_mode():
            x = torch.tensor([v.values for v in vectors], dtype=torch.float32)
            confidence, label = self.net(x).softmax(dim=1).max(dim=1)
        return [Prediction(label=int(lbl), confidence=round(float(c), 4))
                for lbl, c in zip(label.tolist(), confidence.tolist(), strict=True)]
