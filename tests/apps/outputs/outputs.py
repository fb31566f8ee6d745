"""A test subject: functions whose output the encoder cannot write when asked (a list that holds itself; an integer
beyond msgpack's 64 bits), and a plain one otherwise. One replica each: a later call runs where the bad one did."""

from typing import Any

import ember

app = ember.App("outputs")


def _output(kind: str) -> Any:
    if kind == "itself":
        loop: list[Any] = []
        loop.append(loop)
        return loop
    if kind == "huge":
        return 2**70  # JSON writes it; msgpack cannot
    return kind


@app.function(min_replicas=1, max_replicas=1, timeout_s=20)
def one(kind: str) -> Any:
    return _output(kind)


@app.function(batch=ember.Batch(max_size=8, window_ms=200), min_replicas=1, max_replicas=1, timeout_s=20)
def many(kinds: list[str]) -> list[Any]:
    return [_output(kind) for kind in kinds]
