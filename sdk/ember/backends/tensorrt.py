"""TensorRT 10 engines: build one from ONNX, load it, and run batches by tensor name on a CUDA stream.

Device buffers and the stream come from torch (a CUDA build), so there is no pycuda dependency.
tensorrt and torch are imported when a helper is first called, never when this module is imported.
An engine is specific to the GPU model and TensorRT version that built it: build it on the node (in
``@ember.setup``, cached on local disk) rather than shipping it in the bundle.

Example:
    >>> from ember.backends import tensorrt as etrt
    >>> plan = etrt.build_engine_from_onnx("model.onnx", "/tmp/model.plan", max_batch=32)
    >>> engine = etrt.Engine(plan)
    >>> engine.optimization_profile_batch_sizes()   # the batcher's buckets
    (1, 32, 32)
    >>> engine.infer({"pixels": x})["logits"].shape
    (8, 10)
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ember._errors import InvalidSpecError
from ember.backends._device import cuda_index, resolve
from ember.backends._errors import BackendError, BackendUnavailableError, require
from ember.backends._oom import causes, is_torch_oom, mentions

__all__ = ["Engine", "TensorSpec", "build_engine_from_onnx", "cached_engine", "is_out_of_memory"]

log = logging.getLogger("ember.backends")

_TORCH_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "UINT8": "uint8",
                 "INT32": "int32", "INT64": "int64", "BOOL": "bool"}
_TRT_OOM_TEXT = ("out of memory", "could not be allocated", "outofmemory")


@dataclass(frozen=True)
class TensorSpec:
    """An engine's input or output: name, ``"input"``/``"output"``, torch dtype name, shape (-1 = dynamic)."""

    name: str
    mode: str
    dtype: str
    shape: tuple[int, ...]


class Engine:
    """A deserialized TensorRT engine with one execution context and one CUDA stream.

    Args:
        path: a serialized engine (``.plan``), e.g. from :func:`build_engine_from_onnx`.
        device: ``"cuda:N"``; defaults to :func:`ember.backends.device`.

    Raises:
        BackendUnavailableError: tensorrt or CUDA torch is missing, or the device is the CPU.
        BackendError: TensorRT could not load the engine (built for another GPU or TensorRT version?).

    Example:
        >>> engine = ember.backends.tensorrt.Engine("/tmp/digits.plan")
        >>> [t.name for t in engine.inputs], [t.name for t in engine.outputs]
        (['pixels'], ['logits'])
    """

    def __init__(self, path: str | Path, device: str | None = None) -> None:
        self.device = _gpu(device, "Engine")
        self.path = Path(path)
        trt, torch = _trt(), _cuda_torch(self.device)
        self._torch = torch
        self._logger = _recording_logger(trt)
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(self._logger)  # must outlive the engine
            self._engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
            if self._engine is None:
                raise BackendError(f"{path}: TensorRT {trt.__version__} could not load this engine "
                                   f"({self._logger.last_errors()}); engines only load on the GPU model and "
                                   "TensorRT version that built them: rebuild it on this node")
            self._context = self._engine.create_execution_context()
            self._stream = torch.cuda.Stream()
        specs = [_spec(trt, self._engine, self._engine.get_tensor_name(i)) for i in range(self._engine.num_io_tensors)]
        self.inputs = [s for s in specs if s.mode == "input"]
        self.outputs = [s for s in specs if s.mode == "output"]
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ember.backends.tensorrt.Engine {self.path.name} on {self.device}>"

    def optimization_profile_batch_sizes(self) -> tuple[int, int, int]:
        """The (min, opt, max) batch sizes of profile 0: use them as the batcher's buckets and max_size.

        An engine without a dynamic batch dimension answers its fixed batch size three times.
        """
        dynamic = [s for s in self.inputs if s.shape and s.shape[0] < 0]
        if not dynamic:
            fixed = self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1
            return fixed, fixed, fixed
        low, opt, high = self._engine.get_tensor_profile_shape(dynamic[0].name, 0)
        return int(low[0]), int(opt[0]), int(high[0])

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run one batch: ``inputs`` by name (numpy arrays or torch tensors); outputs by name, as numpy.

        Sets each input's shape, binds every tensor by name and runs ``execute_async_v3`` on the engine's
        stream. Safe to call from several threads (calls run one at a time).

        Raises:
            ValueError: inputs missing or unknown.
            BackendError: a shape outside the optimization profile, or TensorRT failed to run.
        """
        wanted = {s.name for s in self.inputs}
        if set(inputs) != wanted:
            raise ValueError(f"infer(): the engine takes inputs {sorted(wanted)}, got {sorted(inputs)}")
        torch = self._torch
        with self._lock, torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            self._logger.errors.clear()  # report this batch's errors only
            bound = [self._bind_input(spec, inputs[spec.name]) for spec in self.inputs]
            outputs = {spec.name: self._bind_output(spec) for spec in self.outputs}
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise BackendError(f"{self.path.name}: TensorRT failed to run a batch of "
                                   f"{tuple(bound[0].shape)}: {self._logger.last_errors()}")
            result = {name: out.cpu().numpy() for name, out in outputs.items()}  # .cpu() waits for the stream
        return result

    def _bind_input(self, spec: TensorSpec, value: Any) -> Any:
        torch = self._torch
        tensor = torch.as_tensor(value).to(self.device, getattr(torch, spec.dtype)).contiguous()
        if not self._context.set_input_shape(spec.name, tuple(tensor.shape)):
            raise BackendError(f"{self.path.name}: input {spec.name!r} of shape {tuple(tensor.shape)} does not fit "
                               f"the engine (shape {spec.shape}, profile batch sizes "
                               f"{self.optimization_profile_batch_sizes()}): {self._logger.last_errors()}")
        self._context.set_tensor_address(spec.name, tensor.data_ptr())
        return tensor

    def _bind_output(self, spec: TensorSpec) -> Any:
        shape = tuple(self._context.get_tensor_shape(spec.name))
        if any(d < 0 for d in shape):
            raise BackendError(f"{self.path.name}: output {spec.name!r} has a data-dependent shape {shape}, "
                               "which Engine.infer does not support")
        tensor = self._torch.empty(shape, dtype=getattr(self._torch, spec.dtype), device=self.device)
        self._context.set_tensor_address(spec.name, tensor.data_ptr())
        return tensor


def build_engine_from_onnx(onnx_path: str | Path, engine_path: str | Path, *, max_batch: int,
                           opt_batch: int | None = None, min_batch: int = 1, fp16: bool = False,
                           device: str | None = None) -> Path:
    """Build a TensorRT engine from an ONNX model whose first dimension is the batch; write it atomically.

    The optimization profile gives every input the batch range ``min_batch..max_batch`` (tuned for
    ``opt_batch``, by default ``max_batch``); the other dimensions must be static. Building takes seconds
    to minutes and needs the GPU the engine will run on.

    Args:
        onnx_path: the model, exported with a dynamic batch axis.
        engine_path: where to write the serialized engine.
        max_batch: the largest batch (the batcher's ``max_size``).
        opt_batch: the batch size TensorRT tunes for.
        min_batch: the smallest batch.
        fp16: allow half-precision kernels.
        device: ``"cuda:N"``; defaults to :func:`ember.backends.device`.

    Example:
        >>> ember.backends.tensorrt.build_engine_from_onnx("digits.onnx", "/tmp/digits.plan", max_batch=32)
        PosixPath('/tmp/digits.plan')
    """
    opt = max_batch if opt_batch is None else opt_batch
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in (min_batch, opt, max_batch)) \
            or not 1 <= min_batch <= opt <= max_batch:
        raise InvalidSpecError(f"build_engine_from_onnx(min_batch={min_batch!r}, opt_batch={opt_batch!r}, "
                               f"max_batch={max_batch!r}): need ints with 1 <= min_batch <= opt_batch <= max_batch")
    name = _gpu(device, "build_engine_from_onnx")
    trt, torch = _trt(), _cuda_torch(name)
    with torch.cuda.device(name):
        serialized = _build(trt, Path(onnx_path), (min_batch, opt, max_batch), fp16)
    target = Path(engine_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.write_bytes(serialized)
    partial.replace(target)  # concurrent builders never see half an engine
    return target


def cached_engine(onnx_path: str | Path, *, max_batch: int, opt_batch: int | None = None, min_batch: int = 1,
                  fp16: bool = False, device: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The engine for ``onnx_path`` on this node, built by :func:`build_engine_from_onnx` on first use.

    Engines are cached in ``cache_dir`` (default: ``ember-tensorrt`` in the temp directory) under a name
    made of the model's sha256, the TensorRT version, the GPU model and the build settings, so a new
    model, driver stack or GPU gets a new engine. Arguments are those of :func:`build_engine_from_onnx`.

    Example:
        >>> plan = ember.backends.tensorrt.cached_engine("digits.onnx", max_batch=32)
        >>> engine = ember.backends.tensorrt.Engine(plan)
    """
    name = _gpu(device, "cached_engine")
    trt, torch = _trt(), _cuda_torch(name)
    model = hashlib.sha256(Path(onnx_path).read_bytes()).hexdigest()[:16]
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", torch.cuda.get_device_name(name)).strip("-")
    settings = f"b{min_batch}-{max_batch if opt_batch is None else opt_batch}-{max_batch}{'-fp16' if fp16 else ''}"
    folder = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "ember-tensorrt"
    plan = folder / f"{Path(onnx_path).stem}-{model}-trt{trt.__version__}-{gpu}-{settings}.plan"
    if not plan.exists():
        build_engine_from_onnx(onnx_path, plan, max_batch=max_batch, opt_batch=opt_batch, min_batch=min_batch,
                               fp16=fp16, device=name)
    return plan


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a GPU allocation failure of an :class:`Engine`.

    Recognises TensorRT's "out of memory" / "could not be allocated" errors (carried by the
    :class:`~ember.backends.BackendError` that ``infer`` raises) and torch's, which allocates the buffers.
    """
    if is_torch_oom(exc):
        return True
    return any(isinstance(err, BackendError) and mentions(err, _TRT_OOM_TEXT) for err in causes(exc))


def _build(trt: ModuleType, onnx_path: Path, batches: tuple[int, int, int], fp16: bool) -> Any:
    logger = _recording_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # from the file, so that external weights are found
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendError(f"{onnx_path}: TensorRT could not parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    config.add_optimization_profile(_profile(builder, network, batches, onnx_path))
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendError(f"{onnx_path}: TensorRT could not build an engine: {logger.last_errors()}")
    return serialized


def _profile(builder: Any, network: Any, batches: tuple[int, int, int], onnx_path: Path) -> Any:
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        rest = tuple(tensor.shape)[1:]
        if any(d < 0 for d in rest):
            raise BackendError(f"{onnx_path}: input {tensor.name!r} has dynamic dimensions besides the batch "
                               f"({tuple(tensor.shape)}); only the first may be dynamic here")
        low, opt, high = ((b, *rest) for b in batches)
        profile.set_shape(tensor.name, low, opt, high)
    return profile


def _gpu(device: str | None, where: str) -> str:
    name = resolve(device)
    if cuda_index(name) is None:
        raise BackendUnavailableError(f"{where}(): TensorRT runs on a GPU, and this replica's device is {name!r}; "
                                      "ask for one with @app.model(gpu=1), or use ember.backends.onnx on the CPU")
    return name


def _trt() -> ModuleType:
    return require("tensorrt", "pip install 'tensorrt>=10,<11' on a host with an NVIDIA GPU")


def _cuda_torch(device: str) -> ModuleType:
    torch = require("torch", "the TensorRT backend allocates buffers with torch: install its CUDA build")
    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"{device}: torch {torch.__version__} cannot use CUDA here (a CPU-only build, "
                                      "or no NVIDIA driver or GPU visible to this process)")
    return torch


def _spec(trt: ModuleType, engine: Any, name: str) -> TensorSpec:
    mode = "input" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "output"
    kind = engine.get_tensor_dtype(name).name
    if kind not in _TORCH_DTYPES:
        raise BackendError(f"tensor {name!r} has TensorRT type {kind}, which Engine does not support")
    return TensorSpec(name, mode, _TORCH_DTYPES[kind], tuple(int(d) for d in engine.get_tensor_shape(name)))


def _recording_logger(trt: ModuleType) -> Any:
    """A ``trt.ILogger`` that forwards warnings and errors to logging and keeps the last errors."""

    class RecordingLogger(trt.ILogger):  # type: ignore[name-defined]  # trt is imported at run time
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: deque[str] = deque(maxlen=8)

        def log(self, severity: Any, msg: str) -> None:
            level = int(severity)
            if level <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
            if level <= int(trt.ILogger.Severity.WARNING):
                log.log(logging.ERROR if level <= int(trt.ILogger.Severity.ERROR) else logging.WARNING,
                        "TensorRT: %s", msg)

        def last_errors(self) -> str:
            return " | ".join(self.errors) or "no error logged"

    return RecordingLogger()
