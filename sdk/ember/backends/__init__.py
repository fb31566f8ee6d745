"""Model backends for ``@ember.setup``: torch, ONNX Runtime, TensorRT and vLLM on the replica's device.

Each backend is a module whose library is imported only when one of its helpers runs, so importing
``ember.backends`` (or ``ember``) loads none of them.

- :func:`device`: the replica's assigned device, ``"cpu"`` or ``"cuda:N"`` (``EMBER_DEVICE``).
- :mod:`ember.backends.torch`: placement, ``inference_mode``, half/bfloat16, batch stacking with padding.
- :mod:`ember.backends.onnx`: sessions on the real device, never silently on the CPU; IO binding on GPU.
- :mod:`ember.backends.tensorrt`: TensorRT 10 engines; their profile batch sizes become the batcher's buckets.
- :mod:`ember.backends.vllm`: a vLLM engine on the replica's GPUs (tensor parallel), served on ``/openai/v1``.
- :func:`warm_up` and :func:`is_out_of_memory`, for any backend.

Example:
    >>> from ember.backends import torch as et
    >>> @ember.setup
    ... def load(self):
    ...     self.net = et.load_module(DigitsNet, "weights.pt")   # on ember.backends.device()
"""

from ember.backends import onnx, tensorrt, torch, vllm
from ember.backends._device import device
from ember.backends._errors import BackendError, BackendUnavailableError, DeviceFallbackError
from ember.backends._oom import causes
from ember.backends._warmup import warm_up

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "DeviceFallbackError",
    "device",
    "is_out_of_memory",
    "onnx",
    "tensorrt",
    "torch",
    "vllm",
    "warm_up",
]


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a GPU or host allocation failure of torch, ONNX Runtime, TensorRT or Python.

    A batch that fails this way may fit when split. It looks at the exception and what it was raised
    ``from``, and imports none of the backends.

    Example:
        >>> try:
        ...     outputs = run_batch(items)
        ... except Exception as exc:
        ...     if ember.backends.is_out_of_memory(exc):
        ...         outputs = run_batch(items[: len(items) // 2]) + run_batch(items[len(items) // 2 :])
    """
    return (any(isinstance(err, MemoryError) for err in causes(exc)) or tensorrt.is_out_of_memory(exc)
            or onnx.is_out_of_memory(exc))
