"""``ember.backends.onnx`` with real ONNX Runtime (onnxruntime-gpu, which runs on the CPU here).

On a machine without a usable GPU, asking for ``cuda:0`` is the real silent-fallback case: ONNX Runtime
logs errors and hands back a CPU session; these tests check that Ember catches it.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
from support.lazy import torch
from support.paths import DIGITS

import ember
from ember.backends import DeviceFallbackError
from ember.backends import onnx as eo

MODEL = DIGITS / "digits.onnx"
SAMPLES = json.loads((DIGITS / "samples.json").read_text())
PIXELS = np.asarray([s["pixels"] for s in SAMPLES], dtype=np.float32)
LABELS = [s["label"] for s in SAMPLES]
ort_cannot_use_cuda = pytest.mark.skipif("cuda()",
                                         reason="checks the silent CPU fallback of a machine without a GPU")


@pytest.fixture(autouse=True)
def _cpu_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DEVICE", raising=False)


def test_a_cpu_session_runs_the_digits_model() -> None:
    sess = eo.session(MODEL, intra_op_threads=1)
    assert (sess.device, sess.requested_device, sess.degraded) == ("cpu", "cpu", False)
    assert sess.providers == ["CPUExecutionProvider"]
    assert sess.ort_session.get_session_options().intra_op_num_threads == 1
    outputs = eo.run(sess, {"pixels": PIXELS})
    assert list(outputs) == ["logits"]
    assert outputs["logits"].shape == (len(SAMPLES), 10)
    assert outputs["logits"].argmax(axis=1).tolist() == LABELS


def test_outputs_match_the_torch_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DIGITS))
    model = importlib.import_module("model")
    sys.modules.pop("model", None)
    with torch.inference_mode():
        expected = model.load(DIGITS / "weights.pt")(torch.from_numpy(PIXELS)).numpy()
    np.testing.assert_allclose(eo.run(eo.session(MODEL), {"pixels": PIXELS})["logits"], expected, atol=1e-4)


def test_io_binding_gives_the_same_outputs() -> None:
    sess = eo.session(MODEL)
    plain = eo.run(sess, {"pixels": PIXELS}, io_binding=False)["logits"]
    bound = eo.run(sess, {"pixels": np.asfortranarray(PIXELS)}, ["logits"], io_binding=True)["logits"]
    np.testing.assert_array_equal(bound, plain)


def test_run_takes_a_bare_inference_session() -> None:
    raw = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    assert eo.run(raw, {"pixels": PIXELS})["logits"].argmax(axis=1).tolist() == LABELS


def test_a_missing_model_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no ONNX model"):
        eo.session(DIGITS / "missing.onnx")


def test_a_bad_device_is_refused() -> None:
    with pytest.raises(ember.InvalidSpecError, match="cuda:N"):
        eo.session(MODEL, device="gpu0")


@ort_cannot_use_cuda
def test_a_gpu_session_that_fell_back_to_the_cpu_is_refused() -> None:
    with pytest.raises(DeviceFallbackError, match="allow_cpu_fallback") as info:
        eo.session(MODEL, device="cuda:0")
    assert (info.value.requested, info.value.actual) == ("cuda:0", "cpu")
    assert info.value.providers == ["CPUExecutionProvider"]
    assert isinstance(info.value, ember.EmberError)


@ort_cannot_use_cuda
def test_the_replicas_device_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEVICE", "cuda:1")
    with pytest.raises(DeviceFallbackError) as info:
        eo.session(MODEL)
    assert info.value.requested == "cuda:1"


@ort_cannot_use_cuda
def test_a_fallback_can_be_served_marked_degraded(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ember.backends"):
        sess = eo.session(MODEL, device="cuda:0", allow_cpu_fallback=True)
    assert (sess.device, sess.requested_device, sess.degraded) == ("cpu", "cuda:0", True)
    assert any("DEGRADED" in r.getMessage() and "cuda:0" in r.getMessage() for r in caplog.records)
    assert eo.run(sess, {"pixels": PIXELS})["logits"].argmax(axis=1).tolist() == LABELS


@ort_cannot_use_cuda
def test_a_tensorrt_provider_that_cannot_start_is_dropped_then_the_fallback_caught(
        caplog: pytest.LogCaptureFixture) -> None:
    assert "TensorrtExecutionProvider" in ort.get_available_providers()  # compiled in, yet unusable here
    with caplog.at_level(logging.WARNING, logger="ember.backends"), pytest.raises(DeviceFallbackError):
        eo.session(MODEL, device="cuda:0", tensorrt=True)
    assert any("TensorRT provider did not start" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("providers", "options", "expected"), [
    (["CPUExecutionProvider"], {"CPUExecutionProvider": {}}, "cpu"),
    (["CUDAExecutionProvider", "CPUExecutionProvider"], {"CUDAExecutionProvider": {"device_id": "0"}}, "cuda:0"),
    (["CUDAExecutionProvider", "CPUExecutionProvider"], {"CUDAExecutionProvider": {"device_id": "2"}}, "cuda:2"),
    (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
     {"TensorrtExecutionProvider": {"device_id": "1"}, "CUDAExecutionProvider": {"device_id": "1"}}, "cuda:1"),
])
def test_placed_on_reads_providers_and_device_id(providers: list[str], options: dict[str, dict[str, str]],
                                                  expected: str) -> None:
    assert eo.placed_on(providers, options) == expected


@pytest.fixture(scope="module")
def tiny_arena() -> Iterator[None]:
    """A 1 MiB CPU arena, used only by sessions that opt in with ``session.use_env_allocators``."""
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg({"max_mem": 1 << 20, "arena_extend_strategy": 1}))
    yield


def test_a_real_arena_allocation_failure_is_out_of_memory(tiny_arena: None) -> None:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    sess = eo.session(MODEL, options=options)
    assert eo.run(sess, {"pixels": PIXELS})["logits"].shape == (len(SAMPLES), 10)  # a small batch fits
    with pytest.raises(Exception) as info:
        eo.run(sess, {"pixels": np.zeros((100_000, 64), dtype=np.float32)})
    assert eo.is_out_of_memory(info.value)
    assert ember.backends.is_out_of_memory(info.value)


def test_other_onnx_runtime_errors_are_not_out_of_memory() -> None:
    with pytest.raises(Exception) as info:
        eo.run(eo.session(MODEL), {"pixels": np.zeros((2, 63), dtype=np.float32)})
    assert type(info.value).__module__.startswith("onnxruntime")
    assert not eo.is_out_of_memory(info.value)
    assert not ember.backends.is_out_of_memory(info.value)


def test_allocation_text_outside_onnx_runtime_is_not_an_onnx_oom() -> None:
    assert not eo.is_out_of_memory(ValueError("Failed to allocate memory for requested buffer"))


def test_the_onnx_digits_example_predicts_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DIGITS))
    try:
        example = importlib.import_module("classifier_onnx")
        schema = importlib.import_module("schema")
    finally:
        for name in ("classifier_onnx", "schema"):
            sys.modules.pop(name, None)
    instance = example.Classifier()
    instance.load()
    assert instance.session.providers == ["CPUExecutionProvider"]
    predictions = instance.predict.local([schema.Image(pixels=s["pixels"]) for s in SAMPLES])
    logits = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"]).run(["logits"], {"pixels": PIXELS})[0]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    assert predictions == [schema.Prediction(label=int(p.argmax()), confidence=round(float(p.max()), 4))
                           for p in probs]
    assert [p.label for p in predictions] == LABELS


@pytest.mark.gpu
@pytest.mark.skipif("not cuda()", reason="needs an NVIDIA GPU")
def test_on_a_gpu_the_session_really_runs_there() -> None:
    sess = eo.session(MODEL, device="cuda:0", tensorrt=False)
    assert (sess.device, sess.degraded) == ("cuda:0", False)
    assert sess.providers[0] == "CUDAExecutionProvider"
    assert eo.run(sess, {"pixels": PIXELS})["logits"].argmax(axis=1).tolist() == LABELS  # through IO binding
    on_device = torch.from_numpy(PIXELS).to("cuda:0")
    np.testing.assert_allclose(eo.run(sess, {"pixels": on_device})["logits"],
                               eo.run(eo.session(MODEL, device="cpu"), {"pixels": PIXELS})["logits"], atol=1e-4)
