"""A test subject for binary bodies, msgpack and the Open Inference Protocol: functions of bytes, of a Struct holding
bytes, and of numpy arrays (the array functions run numpy and torch on the CPU)."""

import hashlib
from collections.abc import Iterator
from typing import Annotated

import msgspec
import numpy as np

import ember

app = ember.App("arrays")

Rows = Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, 4))]


class Picture(msgspec.Struct):
    name: str
    data: bytes


@app.function()
def echo(data: bytes) -> bytes:
    """Answers the bytes it was given."""
    return data


@app.function()
def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@app.function(max_body_bytes=64 * 1024)
def small(data: bytes) -> int:
    """Takes at most 64 KiB."""
    return len(data)


class Summary(msgspec.Struct):
    name: str
    size: int
    head: bytes


@app.function()
def describe(picture: Picture) -> Summary:
    return Summary(name=picture.name, size=len(picture.data), head=picture.data[:4])


@app.function()
def scale(x: Rows, factor: Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(1,))]) -> Rows:
    """Each row times the factor, through torch."""
    import torch

    return (torch.from_numpy(x) * float(factor[0])).numpy()


@app.function()
def norms(x: Rows) -> Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None,))]:
    return np.linalg.norm(x, axis=1).astype(np.float32)


@app.function()
def means(x: Rows) -> Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None,))]:
    """Declares float32 and computes in float64: its answers are float32, as its metadata says."""
    return x.astype(np.float64).mean(axis=1)


@app.function()
def misshapen(x: Rows) -> Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None,))]:
    """Declares one size and answers two: an error of the model's, never an answer its metadata denies."""
    return x


@app.function(batch=ember.Batch(max_size=8, window_ms=20))
def batched_sums(xs: list[Rows]) -> list[Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None,))]]:
    """Row sums, a batch of calls at once (each call's rows may differ in number)."""
    return [x.sum(axis=1) for x in xs]


@app.function()
def counts(x: np.ndarray) -> np.ndarray:
    """Any array: the number of elements of each dtype it came as, as int64."""
    return np.array([x.size], dtype=np.int64)


@app.function()
def running_sums(x: Rows) -> Iterator[Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(4,))]]:
    """The running sum of the rows, one item per row: a decoupled model (gRPC's ModelStreamInfer streams it)."""
    total = np.zeros(4, dtype=np.float32)
    for row in x:
        total = total + row
        yield total


other = ember.App("arrays-other")  # a second app: a token limited to "arrays" must not see its models


@other.function()
def double(x: Rows) -> Rows:
    return x * 2
