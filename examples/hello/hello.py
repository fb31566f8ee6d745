"""Plain-Python functions: `ember push examples/hello/hello.py`, then `ember call hello.greet --data '"Ada"'`."""

import math

import msgspec

import ember

app = ember.App("hello")


class Point(msgspec.Struct):
    x: float
    y: float


@app.function()
def greet(name: str) -> str:
    """One argument: the request body is the argument itself, e.g. `"Ada"`."""
    print(f"greeting {name}")
    return f"Hello, {name}!"


@app.function()
def add(a: int, b: int = 0) -> int:
    """Several arguments: the body is an object of them, e.g. `{"a": 1, "b": 2}`."""
    return a + b


@app.function()
def norm(p: Point) -> float:
    """A typed input: the body must be a Point, e.g. `{"x": 3, "y": 4}`."""
    return math.hypot(p.x, p.y)  # no overflow for coordinates near 1e308


@app.function(batch=ember.Batch(max_size=64, window_ms=2))
def echo(items: list[dict]) -> list[dict]:
    """Batched echo, used by the HTTP benchmark."""
    return items
