"""An app whose first line is ``import numpy as np``, as most model code starts."""

import numpy as np

import ember

app = ember.App("imports-numpy")


@app.function(min_replicas=1)
def total(xs: list[float]) -> float:
    return float(np.asarray(xs, dtype=np.float64).sum())
