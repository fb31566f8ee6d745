"""The app of bench/idle_scale.py: one trivial function that runs no replica until called (``min_replicas=0``)."""

import ember

app = ember.App("idle")


@app.function(min_replicas=0)
def ping(item: dict) -> dict:
    return item
