"""An app whose first line is ``import torch`` (torch's own optional imports, ``monkeytype`` and the like, stay
torch's business)."""

import torch

import ember

app = ember.App("imports-torch")


@app.function(min_replicas=1)
def total(xs: list[float]) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).sum().item())
