"""``ember.backends.tensorrt``: clear errors everywhere; engines built and run where a GPU and TensorRT exist.

The tests marked ``gpu`` build a real engine from examples/digits/digits.onnx and skip without a GPU,
CUDA torch or the ``tensorrt`` package.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.lazy import torch
from support.paths import DIGITS, REPO

import ember
from ember.backends import BackendError, BackendUnavailableError
from ember.backends import tensorrt as etrt

MODEL = DIGITS / "digits.onnx"
SAMPLES = json.loads((DIGITS / "samples.json").read_text())
PIXELS = np.asarray([s["pixels"] for s in SAMPLES], dtype=np.float32)
LABELS = [s["label"] for s in SAMPLES]


@pytest.fixture(autouse=True)
def _replica_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEVICE", "cuda:0")


def test_the_cpu_is_refused_before_anything_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEVICE", "cpu")
    with pytest.raises(BackendUnavailableError, match="runs on a GPU"):
        etrt.Engine("any.plan")
    with pytest.raises(BackendUnavailableError, match="runs on a GPU"):
        etrt.build_engine_from_onnx(MODEL, "any.plan", max_batch=8)
    with pytest.raises(BackendUnavailableError, match="runs on a GPU"):
        etrt.cached_engine(MODEL, max_batch=8, device="cpu")


def test_missing_tensorrt_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail, installed or not
    with pytest.raises(BackendUnavailableError, match="pip install 'tensorrt") as info:
        etrt.Engine(tmp_path / "model.plan")
    assert isinstance(info.value, ImportError)
    with pytest.raises(BackendUnavailableError, match="tensorrt is not installed"):
        etrt.build_engine_from_onnx(MODEL, tmp_path / "model.plan", max_batch=8)
    assert not (tmp_path / "model.plan").exists()


@pytest.mark.parametrize(("kwargs"), [{"max_batch": 0}, {"max_batch": 8, "opt_batch": 9},
                                      {"max_batch": 8, "min_batch": 4, "opt_batch": 2}, {"max_batch": 8.0},
                                      {"max_batch": True}])
def test_build_checks_batch_sizes_first(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ember.InvalidSpecError, match="min_batch <= opt_batch <= max_batch"):
        etrt.build_engine_from_onnx(MODEL, "never.plan", **kwargs)


@pytest.mark.skipif("cuda()", reason="checks a machine where torch has no CUDA")
def test_a_cpu_build_of_torch_is_unavailable_for_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", importlib.import_module("types").ModuleType("tensorrt"))
    with pytest.raises(BackendUnavailableError, match="cannot use CUDA"):
        etrt.Engine("any.plan")


def test_tensorrt_out_of_memory_forms() -> None:
    failed = BackendError("digits.plan: TensorRT failed to run a batch of (32, 64): [defaultAllocator.cpp::allocate"
                          "::31] Error Code 1: Cuda Runtime (out of memory)")
    assert etrt.is_out_of_memory(failed)
    assert etrt.is_out_of_memory(BackendError("Requested amount of GPU memory (1073741824 bytes) could not be "
                                              "allocated. There may not be enough free memory for allocation"))
    assert etrt.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))  # torch allocates the buffers
    assert ember.backends.is_out_of_memory(failed)
    assert not etrt.is_out_of_memory(BackendError("input 'pixels' of shape (64, 64) does not fit the engine"))
    assert not etrt.is_out_of_memory(ValueError("out of memory"))


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          cwd=REPO)


def test_the_example_is_inspectable_without_a_gpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "ember._inspect", str(DIGITS / "tensorrt_app.py")],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    assert manifest["app"] == "digits-trt"
    (service,) = manifest["services"]
    assert (service["name"], service["gpu_count"]) == ("Classifier", 1)
    assert [f["name"] for f in service["functions"]] == ["Classifier.predict"]
    assert service["functions"][0]["batch"]["max_size"] == 32


def test_importing_the_example_loads_neither_tensorrt_nor_torch() -> None:
    proc = _run(f"import sys; sys.path.insert(0, {str(DIGITS)!r}); import tensorrt_app; "
                "print(sorted({'tensorrt', 'torch', 'onnxruntime'} & set(sys.modules)))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _gpu_with_tensorrt() -> Any:
    """Skips only for want of a device: on a GPU host ``make test`` installs the gpu extra, so a missing TensorRT
    there is a failure, not a skip."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and the CUDA build of torch")
    return importlib.import_module("tensorrt")


@pytest.fixture(scope="module")
def digits_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _gpu_with_tensorrt()
    return etrt.build_engine_from_onnx(MODEL, tmp_path_factory.mktemp("trt") / "digits.plan", max_batch=32,
                                       opt_batch=8, device="cuda:0")


@pytest.mark.gpu
def test_an_engine_enumerates_its_tensors_and_profile(digits_plan: Path) -> None:
    engine = etrt.Engine(digits_plan)
    assert [(t.name, t.mode, t.dtype, t.shape) for t in engine.inputs] == [("pixels", "input", "float32", (-1, 64))]
    assert [(t.name, t.mode, t.dtype) for t in engine.outputs] == [("logits", "output", "float32")]
    assert engine.optimization_profile_batch_sizes() == (1, 8, 32)


@pytest.mark.gpu
def test_an_engine_infers_like_onnx_runtime(digits_plan: Path) -> None:
    from ember.backends import onnx as eo

    engine = etrt.Engine(digits_plan)
    expected = eo.run(eo.session(MODEL, device="cpu"), {"pixels": PIXELS})["logits"]
    logits = engine.infer({"pixels": PIXELS})["logits"]
    np.testing.assert_allclose(logits, expected, atol=1e-3)
    assert logits.argmax(axis=1).tolist() == LABELS
    for size in (1, 32):
        batch = np.resize(PIXELS, (size, 64))
        assert engine.infer({"pixels": torch.from_numpy(batch)})["logits"].shape == (size, 10)


@pytest.mark.gpu
def test_an_engine_refuses_what_it_cannot_run(digits_plan: Path) -> None:
    engine = etrt.Engine(digits_plan)
    with pytest.raises(BackendError, match="does not fit"):
        engine.infer({"pixels": np.zeros((33, 64), dtype=np.float32)})
    with pytest.raises(ValueError, match="takes inputs"):
        engine.infer({"image": PIXELS})


@pytest.mark.gpu
def test_an_engine_that_is_not_an_engine_is_a_backend_error(tmp_path: Path) -> None:
    _gpu_with_tensorrt()
    (tmp_path / "junk.plan").write_bytes(b"not an engine")
    with pytest.raises(BackendError, match="could not load this engine"):
        etrt.Engine(tmp_path / "junk.plan")


@pytest.mark.gpu
def test_the_tensorrt_example_predicts_the_sample_labels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _gpu_with_tensorrt()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # its engine cache
    monkeypatch.syspath_prepend(str(DIGITS))
    try:
        example = importlib.import_module("tensorrt_app")
        schema = importlib.import_module("schema")
    finally:
        for name in ("tensorrt_app", "schema"):
            sys.modules.pop(name, None)
    instance = example.Classifier()
    instance.load()
    predictions = instance.predict.local([schema.Image(pixels=s["pixels"]) for s in SAMPLES])
    assert [p.label for p in predictions] == LABELS
    assert list((tmp_path / "ember-tensorrt").glob("digits-*.plan"))
