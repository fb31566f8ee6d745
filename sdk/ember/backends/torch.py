"""torch helpers for ``@ember.setup`` and batched methods: placement, inference mode, batching, warm-up.

torch is imported when a helper is first called, never when this module is imported.

Example:
    >>> from ember.backends import torch as et
    >>> @app.model(gpu=1)
    ... class Classifier:
    ...     @ember.setup
    ...     def load(self):
    ...         self.net = et.load_module(Net, "weights.pt", dtype="bfloat16")
    ...     @ember.method(batch=ember.Batch(max_size=32))
    ...     def predict(self, images: list[Image]) -> list[int]:
    ...         with et.inference():
    ...             x, n = et.stack([im.pixels for im in images], dtype="bfloat16")
    ...             return et.unstack(self.net(x).argmax(dim=1), n, tolist=True)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ember._errors import InvalidSpecError
from ember.backends._device import cuda_index, memory_budget_mb, resolve
from ember.backends._errors import BackendUnavailableError, require
from ember.backends._oom import is_torch_oom
from ember.backends._warmup import warm_up

if TYPE_CHECKING:
    import torch

__all__ = ["inference", "is_out_of_memory", "load_module", "stack", "unstack", "warm_up"]


def load_module(factory_or_module: torch.nn.Module | Callable[[], torch.nn.Module],
                weights_path: str | Path | None = None, *, device: str | None = None,
                dtype: torch.dtype | str | None = None, strict: bool = True) -> torch.nn.Module:
    """Build (or take) a module, load its weights, place it on the replica's device, in eval mode.

    Args:
        factory_or_module: an ``nn.Module``, or a callable that builds one (its class, usually).
        weights_path: a ``state_dict`` saved with ``torch.save``; loaded with ``weights_only=True``.
        device: ``"cpu"`` or ``"cuda:N"``; defaults to :func:`ember.backends.device`.
        dtype: cast floating-point parameters, e.g. ``"bfloat16"`` or ``torch.float16``. Half precision
            is refused on the CPU (slow or missing kernels): use ``"bfloat16"`` or ``None`` there.
        strict: passed to ``load_state_dict``.

    Raises:
        BackendUnavailableError: torch is missing, or the device is a GPU torch cannot use here.
        InvalidSpecError: a bad device, dtype or factory.

    Example:
        >>> net = ember.backends.torch.load_module(DigitsNet, "weights.pt")
        >>> net.training
        False
    """
    torch = _torch()
    target = _device(device)
    cast = _dtype(torch, dtype)
    if cast == torch.float16 and target.type == "cpu":
        raise InvalidSpecError("load_module(dtype=float16) on the CPU: half-precision CPU kernels are slow or "
                               "missing; use dtype='bfloat16' or None there, e.g. dtype='float16' if "
                               "ember.backends.device() != 'cpu' else None")
    _cap_memory(torch, target)
    module = _build(torch, factory_or_module)
    if weights_path is not None:
        module.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True), strict=strict)
    if cast is None:
        module.to(device=target)
    else:
        module.to(device=target, dtype=cast)  # one parameter at a time: no second copy of the model
    return module.eval()


def _cap_memory(torch: Any, target: Any) -> None:
    """On a GPU shared by memory, keep torch's allocator within the replica's reservation."""
    budget = memory_budget_mb()
    if target.type != "cuda" or not budget:
        return
    total_mb = torch.cuda.get_device_properties(target).total_memory / (1024 * 1024)
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total_mb), target)


def inference() -> Any:
    """A ``torch.inference_mode()`` context (no autograd bookkeeping); enter it in the batched method.

    Inference mode is per thread and batches run on a worker thread, so enter it where the model runs,
    not in setup. It works as a decorator too.

    Example:
        >>> with ember.backends.torch.inference():
        ...     logits = self.net(x)
    """
    return _torch().inference_mode()


def stack(items: Sequence[Any], *, pad_to_buckets: Sequence[int] | None = None, pad_value: float = 0,
          device: str | None = None, dtype: torch.dtype | str | None = None) -> tuple[torch.Tensor, int]:
    """Stack equal-shaped items into one batch tensor on the device; return it and the real item count.

    Items are tensors, numpy arrays or nested lists (such as a decoded ``list[float]`` field), all of one
    shape. With ``pad_to_buckets`` the batch dimension is padded with ``pad_value`` up to the smallest
    bucket that holds it, for models that need static shapes (compiled graphs, CUDA graphs, TensorRT);
    :func:`unstack` drops the padding again.

    Args:
        items: the batch's inputs, at least one.
        pad_to_buckets: allowed batch sizes, e.g. ``(1, 8, 32)``; a larger batch is an error.
        pad_value: fill value of the padding rows.
        device: defaults to :func:`ember.backends.device`.
        dtype: e.g. ``"float32"``; by default torch infers it (float32 for Python floats).

    Raises:
        ValueError: no items, items of different shapes, or more items than the largest bucket.

    Example:
        >>> x, n = ember.backends.torch.stack([[0.0] * 64] * 5, pad_to_buckets=(1, 8, 32))
        >>> tuple(x.shape), n
        ((8, 64), 5)
    """
    torch = _torch()
    if not items:
        raise ValueError("stack() needs at least one item")
    n = len(items)
    size = _bucket(n, pad_to_buckets) if pad_to_buckets is not None else n
    batch = _stack_items(torch, items, _dtype(torch, dtype))
    if size > n:
        batch = torch.cat([batch, batch.new_full((size - n, *batch.shape[1:]), pad_value)])
    return batch.to(_device(device)), n


def unstack(batch: torch.Tensor, n: int, *, tolist: bool = False) -> list[Any]:
    """Split a batch output into its first ``n`` items, dropping padding rows; on the CPU.

    Args:
        batch: a tensor whose first dimension is the (possibly padded) batch.
        n: the real item count that :func:`stack` returned.
        tolist: return Python values (``tensor.tolist()`` per item) instead of tensors.

    Example:
        >>> labels = ember.backends.torch.unstack(logits.argmax(dim=1), n, tolist=True)
        >>> labels
        [3, 1, 4]
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= batch.shape[0]:
        raise ValueError(f"unstack(n={n!r}): n is an int from 0 to the batch size {batch.shape[0]}")
    rows = batch[:n] if n < batch.shape[0] else batch
    if tolist:
        values: list[Any] = rows.tolist()
        return values
    return list(rows.detach().cpu().unbind(0))


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is torch running out of GPU or host memory.

    Recognises ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``) and the message forms of
    allocator failures ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "DefaultCPUAllocator:
    can't allocate memory"). The batcher splits a batch that fails this way. Never imports torch.

    Example:
        >>> try:
        ...     net(x)
        ... except RuntimeError as exc:
        ...     if ember.backends.torch.is_out_of_memory(exc): ...
    """
    return is_torch_oom(exc)


@functools.cache
def _torch() -> ModuleType:
    return require("torch", "pip install torch (see https://pytorch.org for the CUDA build)")


def _device(device: str | None) -> torch.device:
    return _placement(resolve(device))


@functools.lru_cache(maxsize=16)
def _placement(name: str) -> torch.device:
    torch = _torch()
    index = cuda_index(name)
    if index is not None:
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"device {name!r}: torch {torch.__version__} cannot use CUDA here (a CPU-only build of torch, "
                "or no NVIDIA driver or GPU visible to this process)")
        if index >= torch.cuda.device_count():
            raise BackendUnavailableError(
                f"device {name!r}: this process sees {torch.cuda.device_count()} GPU(s) (check CUDA_VISIBLE_DEVICES)")
    return torch.device(name)


def _dtype(torch: ModuleType, dtype: Any) -> Any:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, dtype, None) if isinstance(dtype, str) and dtype.isidentifier() else None
    if not isinstance(found, torch.dtype):
        raise InvalidSpecError(f"dtype={dtype!r}: use a torch.dtype or its name, e.g. 'float32' or 'bfloat16'")
    return found


def _build(torch: ModuleType, factory_or_module: Any) -> Any:
    module = factory_or_module
    if not isinstance(module, torch.nn.Module) and callable(module):
        module = module()
    if not isinstance(module, torch.nn.Module):
        raise InvalidSpecError(f"load_module({factory_or_module!r}): pass an nn.Module or a callable that "
                               f"returns one (got {type(module).__name__})")
    return module


def _bucket(n: int, buckets: Sequence[int]) -> int:
    sizes = sorted(set(buckets))
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"pad_to_buckets={buckets!r}: give one or more batch sizes >= 1, e.g. (1, 8, 32)")
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"stack(): a batch of {n} items is larger than the largest bucket ({sizes[-1]}); "
                     "keep the batch's max_size within the buckets")


def _stack_items(torch: ModuleType, items: Sequence[Any], dtype: Any) -> Any:
    try:
        if isinstance(items[0], list | tuple | int | float):
            return torch.tensor(items, dtype=dtype)
        batch = torch.stack([torch.as_tensor(item) for item in items])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"stack(): the {len(items)} items must have one shape (pad or resize them first): "
                         f"{exc}") from exc
    return batch if dtype is None else batch.to(dtype)
