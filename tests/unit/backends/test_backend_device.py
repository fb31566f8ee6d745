"""``ember.backends`` itself: the replica's device, the public surface, import cost, warm-up, OOM recognition."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

import ember
import ember.backends
from ember.backends import BackendError, BackendUnavailableError, DeviceFallbackError, device, warm_up

PUBLIC = ["BackendError", "BackendUnavailableError", "DeviceFallbackError", "device", "is_out_of_memory", "onnx",
          "tensorrt", "torch", "vllm", "warm_up"]


def test_all_is_pinned() -> None:
    assert ember.backends.__all__ == PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_are_documented(name: str) -> None:
    assert inspect.getdoc(getattr(ember.backends, name))


def test_errors_are_ember_errors_and_stay_out_of_ember() -> None:
    assert issubclass(BackendError, ember.EmberError)
    assert issubclass(DeviceFallbackError, BackendError)
    assert issubclass(BackendUnavailableError, BackendError)
    assert issubclass(BackendUnavailableError, ImportError)
    assert not hasattr(ember, "DeviceFallbackError")
    err = DeviceFallbackError("fell back", requested="cuda:0", actual="cpu", providers=["CPUExecutionProvider"])
    assert (str(err), err.requested, err.actual, err.providers) == ("fell back", "cuda:0", "cpu",
                                                                    ["CPUExecutionProvider"])


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def test_import_ember_does_not_import_backends() -> None:
    loaded = _modules_after("import ember")
    assert "ember" in loaded
    assert "ember.backends" not in loaded


def test_importing_every_backend_module_loads_no_backend_library() -> None:
    loaded = _modules_after("import ember.backends.torch, ember.backends.onnx, ember.backends.tensorrt")
    assert "ember.backends.tensorrt" in loaded
    assert {"torch", "onnxruntime", "tensorrt", "numpy"} & loaded == set()


def test_device_defaults_to_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DEVICE", raising=False)
    assert device() == "cpu"
    monkeypatch.setenv("EMBER_DEVICE", "")
    assert device() == "cpu"


@pytest.mark.parametrize(("raw", "expected"), [("cpu", "cpu"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3"),
                                               ("cuda", "cuda:0"), (" CUDA:1 ", "cuda:1")])
def test_device_reads_ember_device(monkeypatch: pytest.MonkeyPatch, raw: str, expected: str) -> None:
    monkeypatch.setenv("EMBER_DEVICE", raw)
    assert device() == expected


@pytest.mark.parametrize("raw", ["gpu", "cuda:", "cuda:x", "cuda:0,1", "mps"])
def test_a_bad_ember_device_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("EMBER_DEVICE", raw)
    with pytest.raises(ember.InvalidSpecError, match="EMBER_DEVICE"):
        device()


def test_replicas_see_only_their_devices(tmp_path: Path) -> None:
    from support.builders import slot

    from ember_runtime.agent.node import NodeAgent

    cpu_slot = slot("r-0")
    gpu_slot = slot("r-1", "GPU-aaaa", "GPU-bbbb", index=1, gpu_indices=[2, 3])
    real = NodeAgent("nats://127.0.0.1:1", tmp_path)
    assert real._env(cpu_slot) == {"EMBER_DEVICE": "cpu"}
    assert real._env(gpu_slot) == {"EMBER_DEVICE": "cuda:0", "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    declared = tmp_path / "inventory.toml"
    declared.write_text('[[gpu]]\nmodel = "H100-80GB"\ncount = 4\n')
    virtual = NodeAgent("nats://127.0.0.1:1", tmp_path, inventory=declared)
    # A declared inventory has no real GPUs: its replicas run on the CPU, still seeing only their devices.
    assert virtual._env(gpu_slot) == {"EMBER_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    shared = slot("r-2", "GPU-aaaa", index=2, memory_mb=12_288)
    assert real._env(shared)["EMBER_GPU_MEMORY_MB"] == "12288"  # torch's allocator is capped to it


def test_the_memory_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.backends._device import memory_budget_mb

    monkeypatch.delenv("EMBER_GPU_MEMORY_MB", raising=False)
    assert memory_budget_mb() == 0
    monkeypatch.setenv("EMBER_GPU_MEMORY_MB", "24576")
    assert memory_budget_mb() == 24576
    monkeypatch.setenv("EMBER_GPU_MEMORY_MB", "lots")
    with pytest.raises(ember.InvalidSpecError, match="EMBER_GPU_MEMORY_MB"):
        memory_budget_mb()


def test_warm_up_runs_each_size_largest_first_and_times_it() -> None:
    seen: list[int] = []

    def fn(items: list[str]) -> list[str]:
        seen.append(len(items))
        assert set(items) == {"x"}
        return [item.upper() for item in items]

    timings = warm_up(fn, "x", sizes=[8, 1, 32, 8], repeats=2)
    assert seen == [32, 32, 8, 8, 1, 1]
    assert list(timings) == [1, 8, 32]
    assert all(isinstance(t, float) and t >= 0 for t in timings.values())


def test_warm_up_checks_the_output_length() -> None:
    with pytest.raises(ValueError, match="returned 1 outputs for a batch of 4"):
        warm_up(lambda items: items[:1], 0, sizes=[4])


@pytest.mark.parametrize(("sizes", "repeats"), [([], 1), ([0], 1), ([2, -1], 1), ([True], 1), ([1.5], 1), ([1], 0)])
def test_warm_up_refuses_bad_sizes(sizes: list[Any], repeats: int) -> None:
    with pytest.raises(ember.InvalidSpecError):
        warm_up(lambda items: items, 0, sizes=sizes, repeats=repeats)


def test_is_out_of_memory_covers_python_and_chains() -> None:
    assert ember.backends.is_out_of_memory(MemoryError())
    assert not ember.backends.is_out_of_memory(ValueError("bad input"))
    try:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise ember.RemoteError("batch failed") from exc
    except ember.RemoteError as wrapped:
        assert ember.backends.is_out_of_memory(wrapped)
