"""Recognising out-of-memory failures by type and text, without importing the libraries that raise them."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

_MAX_CHAIN = 16


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised ``from``, and so on (a wrapped OOM still counts as one)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        yield current
        current = current.__cause__


def mentions(exc: BaseException, markers: Iterable[str]) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in markers)


_TORCH_TEXT = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def is_torch_oom(exc: BaseException) -> bool:
    """torch's ``OutOfMemoryError`` (CUDA or host), or a ``RuntimeError`` with an allocator's message."""
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None)
    for err in causes(exc):
        if oom_type is not None and isinstance(err, oom_type):
            return True
        if isinstance(err, RuntimeError) and mentions(err, _TORCH_TEXT):
            return True
    return False


_ORT_TEXT = ("failed to allocate memory", "out of memory", "smaller than requested bytes",
             "cudaerrormemoryallocation", "_status_alloc_failed")


def is_ort_oom(exc: BaseException) -> bool:
    """An ONNX Runtime exception (``Fail``, ``RuntimeException``, ...) raised by an allocation failure.

    A CUDA arena with ``gpu_mem_limit`` (like a CPU arena with ``max_mem``) reports "Available memory of N
    is smaller than requested bytes of M"; a failed ``cudaMalloc`` reports "Failed to allocate memory".
    """
    return any(type(err).__module__.startswith("onnxruntime") and mentions(err, _ORT_TEXT) for err in causes(exc))
