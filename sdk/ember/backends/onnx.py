"""ONNX Runtime sessions on the replica's real device, and checked to be there.

onnxruntime-gpu falls back to the CPU *silently* when the CUDA or TensorRT libraries it needs are missing
(even ``providers=["CUDAExecutionProvider"]`` alone yields a CPU session), and its Python wrapper retries
a failed GPU session without the ``device_id`` it was given. :func:`session` turns that fallback off,
then reads ``get_providers()`` back: a GPU replica whose session landed on the CPU raises
:class:`~ember.backends.DeviceFallbackError` (so the replica never reports ready), or, when the caller
allows it, is served marked ``degraded`` with a warning in the replica's log.

onnxruntime is imported when a helper is first called, never when this module is imported.

Example:
    >>> from ember.backends import onnx as eo
    >>> sess = eo.session("model.onnx")                       # on ember.backends.device()
    >>> logits = eo.run(sess, {"pixels": x})["logits"]
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ember.backends._device import cuda_index, resolve
from ember.backends._errors import DeviceFallbackError, require
from ember.backends._oom import is_ort_oom

__all__ = ["Session", "is_out_of_memory", "placed_on", "run", "session"]

log = logging.getLogger("ember.backends")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
TENSORRT_CACHE = Path(tempfile.gettempdir()) / "ember-ort-tensorrt-cache"
Provider = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Session:
    """An ``onnxruntime.InferenceSession`` and the device it really runs on.

    Attributes:
        ort_session: the ONNX Runtime session itself.
        device: where it runs: ``"cpu"`` or ``"cuda:N"``.
        requested_device: where it was asked to run.
        degraded: it runs somewhere other than asked (only with ``allow_cpu_fallback=True``).
    """

    ort_session: Any
    device: str
    requested_device: str
    degraded: bool = False

    @property
    def providers(self) -> list[str]:
        """The execution providers the session really uses, most preferred first."""
        return list(self.ort_session.get_providers())


def session(path: str | Path, *, device: str | None = None, intra_op_threads: int | None = None,
            allow_cpu_fallback: bool = False, tensorrt: bool | None = None, options: Any = None) -> Session:
    """Open an ONNX model on the replica's device and check that it really runs there.

    On ``"cuda:N"`` the providers are TensorRT (when available), CUDA, then CPU, all on GPU ``N``; on
    ``"cpu"`` only the CPU provider. A TensorRT provider that cannot start is dropped with a warning
    (its engines are cached in ``TENSORRT_CACHE``).

    Args:
        path: the ``.onnx`` file.
        device: ``"cpu"`` or ``"cuda:N"``; defaults to :func:`ember.backends.device`.
        intra_op_threads: ONNX Runtime's intra-op thread count (``None``: its default).
        allow_cpu_fallback: serve a GPU request that fell back, marked ``degraded``, instead of raising.
        tensorrt: try the TensorRT provider first on a GPU: ``None`` when TensorRT is installed,
            ``True`` whenever ONNX Runtime offers it, ``False`` never.
        options: an ``onnxruntime.SessionOptions`` to start from.

    Raises:
        DeviceFallbackError: a GPU was asked for and the session runs elsewhere.
        FileNotFoundError: no model at ``path``.

    Example:
        >>> sess = ember.backends.onnx.session("digits.onnx", device="cuda:0")
        >>> sess.providers
        ['CUDAExecutionProvider', 'CPUExecutionProvider']
    """
    ort = _ort()
    requested = resolve(device)
    if not Path(path).is_file():
        raise FileNotFoundError(f"session(): no ONNX model at {path}")
    opts = options if options is not None else ort.SessionOptions()
    if intra_op_threads is not None:
        opts.intra_op_num_threads = intra_op_threads
    index = cuda_index(requested)
    raw = _create(ort, path, opts, [(CPU, {})]) if index is None else _create_on_gpu(ort, path, opts, index, tensorrt)
    actual = placed_on(raw.get_providers(), raw.get_provider_options())
    if actual == requested:
        return Session(raw, actual, requested)
    return _fallen_back(Session(raw, actual, requested, degraded=True), path, allow_cpu_fallback)


def run(sess: Session | Any, inputs: Mapping[str, Any], output_names: Sequence[str] | None = None, *,
        io_binding: bool | None = None) -> dict[str, Any]:
    """Run a session; return its outputs by name, as numpy arrays.

    On a GPU session inputs and outputs go through IO binding: host arrays are copied to the device once,
    CUDA torch tensors and ``OrtValue``s are bound in place (no copy), outputs are allocated on the device
    and copied back once. On the CPU it is a plain ``run``.

    Args:
        sess: a :class:`Session` (or a bare ``InferenceSession``, run as on the CPU).
        inputs: input name to array (numpy, CUDA torch tensor or ``OrtValue``).
        output_names: the outputs wanted; all by default.
        io_binding: force IO binding on (``True``) or off (``False``); by default on for GPU sessions.

    Example:
        >>> ember.backends.onnx.run(sess, {"pixels": x})["logits"].shape
        (32, 10)
    """
    raw, where = (sess.ort_session, sess.device) if isinstance(sess, Session) else (sess, "cpu")
    names = list(output_names) if output_names else [o.name for o in raw.get_outputs()]
    index = cuda_index(where)
    bind = index is not None if io_binding is None else io_binding
    if not bind:
        return dict(zip(names, raw.run(names, dict(inputs)), strict=True))
    device_type, device_id = ("cpu", 0) if index is None else ("cuda", index)
    return dict(zip(names, _run_bound(raw, inputs, names, device_type, device_id), strict=True))


def placed_on(providers: Sequence[str], provider_options: Mapping[str, Mapping[str, Any]]) -> str:
    """Where a session with these ``get_providers()`` and ``get_provider_options()`` runs.

    Example:
        >>> placed_on(["CUDAExecutionProvider", "CPUExecutionProvider"], {"CUDAExecutionProvider": {"device_id": "1"}})
        'cuda:1'
    """
    for name in (TENSORRT, CUDA):
        if name in providers:
            return f"cuda:{int(provider_options.get(name, {}).get('device_id', 0))}"
    return "cpu"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an ONNX Runtime allocation failure.

    Recognises ONNX Runtime's exceptions (``Fail``, ``RuntimeException``, ...) whose message is an
    allocator's: "Failed to allocate memory", "out of memory", or an arena's "Available memory of N is
    smaller than requested bytes of M". Never imports onnxruntime.

    Example:
        >>> ember.backends.onnx.is_out_of_memory(exc)
        True
    """
    return is_ort_oom(exc)


def _ort() -> ModuleType:
    return require("onnxruntime", "pip install onnxruntime-gpu (it also runs on the CPU)")


def _create(ort: ModuleType, path: str | Path, opts: Any, providers: list[Provider]) -> Any:
    # enable_fallback=0: no silent retry on other providers (which would also drop device_id), at
    # creation or later in run(); the providers are checked by the caller instead.
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers, enable_fallback=0)


def _create_on_gpu(ort: ModuleType, path: str | Path, opts: Any, index: int, tensorrt: bool | None) -> Any:
    providers: list[Provider] = [(CUDA, {"device_id": index}), (CPU, {})]
    if _want_tensorrt(ort, tensorrt):
        TENSORRT_CACHE.mkdir(parents=True, exist_ok=True)
        trt_options = {"device_id": index, "trt_engine_cache_enable": True,
                       "trt_engine_cache_path": str(TENSORRT_CACHE)}
        try:
            return _create(ort, path, opts, [(TENSORRT, trt_options), *providers])
        except Exception as exc:  # onnxruntime raises RuntimeError or its own Fail/EPFail types
            log.warning("ONNX Runtime's TensorRT provider did not start for %s (%s); trying CUDA", path,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    return _create(ort, path, opts, providers)


def _want_tensorrt(ort: ModuleType, tensorrt: bool | None) -> bool:
    if tensorrt is False or TENSORRT not in ort.get_available_providers():
        return False
    if tensorrt:
        return True
    if importlib.util.find_spec("tensorrt") is not None:
        importlib.import_module("tensorrt")  # loads libnvinfer from the wheel, where ONNX Runtime finds it
        return True
    return ctypes.util.find_library("nvinfer") is not None


def _fallen_back(sess: Session, path: str | Path, allow: bool) -> Session:
    what = (f"{path}: asked ONNX Runtime for {sess.requested_device} but the session runs on {sess.device} "
            f"(providers {sess.providers})")
    if not allow:
        raise DeviceFallbackError(
            f"{what}. onnxruntime-gpu falls back silently when the CUDA/cuDNN (or TensorRT) libraries it "
            "needs are missing or of another major version; its own log lines above say which. Install the "
            "versions it requires, or pass allow_cpu_fallback=True to serve degraded.",
            requested=sess.requested_device, actual=sess.device, providers=sess.providers)
    log.warning("DEGRADED: %s; serving anyway (allow_cpu_fallback=True)", what)
    return sess


def _run_bound(raw: Any, inputs: Mapping[str, Any], names: list[str], device_type: str, device_id: int) -> Any:
    binding = raw.io_binding()
    keep = [_bind_input(binding, name, value) for name, value in inputs.items()]
    for name in names:
        binding.bind_output(name, device_type, device_id)
    raw.run_with_iobinding(binding)
    del keep  # bound device buffers must outlive the run
    return binding.copy_outputs_to_cpu()


def _bind_input(binding: Any, name: str, value: Any) -> Any:
    if type(value).__name__ == "OrtValue":
        binding.bind_ortvalue_input(name, value)
    elif getattr(value, "is_cuda", False):
        return _bind_cuda_tensor(binding, name, value)
    else:
        import numpy as np

        value = np.ascontiguousarray(value)
        binding.bind_cpu_input(name, value)
    return value


def _bind_cuda_tensor(binding: Any, name: str, tensor: Any) -> Any:
    import numpy as np
    import torch

    tensor = tensor.contiguous()
    torch.cuda.current_stream(tensor.device).synchronize()  # ONNX Runtime reads it on its own stream
    binding.bind_input(name, "cuda", tensor.device.index, np.dtype(str(tensor.dtype).removeprefix("torch.")),
                       tuple(tensor.shape), tensor.data_ptr())
    return tensor
