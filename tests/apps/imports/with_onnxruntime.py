"""An app whose first line is ``import onnxruntime``."""

import onnxruntime

import ember

app = ember.App("imports-onnxruntime")


@app.function(min_replicas=1)
def providers() -> list[str]:
    return list(onnxruntime.get_available_providers())
