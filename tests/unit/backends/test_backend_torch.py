"""``ember.backends.torch`` with real torch on the CPU, and the torch digits example built on it."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
from support.lazy import torch
from support.paths import DIGITS

import ember
from ember._volume import VOLUMES_ENV
from ember.backends import BackendUnavailableError
from ember.backends import torch as et

SAMPLES = json.loads((DIGITS / "samples.json").read_text())
no_cuda = pytest.mark.skipif("cuda()", reason="checks a machine where torch has no CUDA")


@pytest.fixture
def digits(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """examples/digits on sys.path, as a replica sees it; its modules forgotten afterwards."""
    monkeypatch.syspath_prepend(str(DIGITS))
    yield importlib.import_module("model")
    for name in ("model", "schema", "classifier"):
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def _cpu_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DEVICE", raising=False)


def _pixels() -> torch.Tensor:
    return torch.tensor([s["pixels"] for s in SAMPLES], dtype=torch.float32)


def test_load_module_builds_loads_places_and_evals(digits: ModuleType) -> None:
    net = et.load_module(digits.DigitsNet, DIGITS / "weights.pt")
    reference = digits.load(DIGITS / "weights.pt")
    assert isinstance(net, digits.DigitsNet)
    assert not net.training
    assert {p.device.type for p in net.parameters()} == {"cpu"}
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    with torch.inference_mode():
        assert torch.equal(net(_pixels()), reference(_pixels()))
        assert net(_pixels()).argmax(dim=1).tolist() == [s["label"] for s in SAMPLES]


def test_load_module_takes_a_module_and_leaves_weights_alone_without_a_path(digits: ModuleType) -> None:
    module = digits.DigitsNet().train()
    before = [p.clone() for p in module.parameters()]
    assert et.load_module(module) is module
    assert not module.training
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True))


def test_load_module_casts_to_bfloat16_on_the_cpu(digits: ModuleType) -> None:
    net = et.load_module(digits.DigitsNet, DIGITS / "weights.pt", dtype="bfloat16")
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    with et.inference():
        x, _ = et.stack([s["pixels"] for s in SAMPLES], dtype=torch.bfloat16)
        assert net(x).argmax(dim=1).tolist() == [s["label"] for s in SAMPLES]


@pytest.mark.parametrize("dtype", ["float16", "half", "torch.float16"])  # the last one given as torch's dtype
def test_half_precision_is_refused_on_the_cpu(digits: ModuleType, dtype: str) -> None:
    given = torch.float16 if dtype == "torch.float16" else dtype  # torch is imported when the test runs
    with pytest.raises(ember.InvalidSpecError, match="bfloat16"):
        et.load_module(digits.DigitsNet, dtype=given)


@pytest.mark.parametrize("dtype", ["float99", "nn", 3])
def test_unknown_dtypes_are_refused(digits: ModuleType, dtype: object) -> None:
    with pytest.raises(ember.InvalidSpecError, match="dtype"):
        et.load_module(digits.DigitsNet, dtype=dtype)  # type: ignore[arg-type]


def test_load_module_needs_a_module() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"nn\.Module"):
        et.load_module(lambda: "not a module")  # type: ignore[arg-type, return-value]


@no_cuda
def test_a_gpu_device_without_cuda_torch_is_unavailable(digits: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BackendUnavailableError, match="cannot use CUDA"):
        et.load_module(digits.DigitsNet, device="cuda:0")
    monkeypatch.setenv("EMBER_DEVICE", "cuda:0")  # the replica's device is the default
    with pytest.raises(BackendUnavailableError, match="'cuda:0'"):
        et.stack([[1.0]])


def test_inference_enters_inference_mode(digits: ModuleType) -> None:
    net = et.load_module(digits.DigitsNet)
    assert not torch.is_inference_mode_enabled()
    with et.inference():
        assert torch.is_inference_mode_enabled()
        assert not net(_pixels()).requires_grad
    assert not torch.is_inference_mode_enabled()


def test_stack_lists_without_padding() -> None:
    batch, n = et.stack([s["pixels"] for s in SAMPLES])
    assert n == len(SAMPLES)
    assert batch.dtype == torch.float32
    assert torch.equal(batch, _pixels())


def test_stack_pads_the_batch_dimension_to_the_next_bucket() -> None:
    items = [torch.full((2, 3), float(i)) for i in range(5)]
    batch, n = et.stack(items, pad_to_buckets=(32, 1, 8), pad_value=-1)
    assert n == 5
    assert tuple(batch.shape) == (8, 2, 3)
    assert torch.equal(batch[:5], torch.stack(items))
    assert bool((batch[5:] == -1).all())
    assert tuple(et.stack(items[:1], pad_to_buckets=(1, 8))[0].shape) == (1, 2, 3)
    assert tuple(et.stack(items, pad_to_buckets=(5,))[0].shape) == (5, 2, 3)


def test_stack_numpy_items_with_a_dtype() -> None:
    items = [np.arange(4, dtype=np.int64) + i for i in range(3)]
    batch, n = et.stack(items, dtype="float32")
    assert (n, batch.dtype) == (3, torch.float32)
    assert batch.tolist() == [[0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0]]


def test_stack_refuses_a_batch_larger_than_the_buckets() -> None:
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        et.stack([[0.0]] * 9, pad_to_buckets=(1, 8))


@pytest.mark.parametrize("buckets", [(), (0, 8), (True,)])
def test_stack_refuses_bad_buckets(buckets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="pad_to_buckets"):
        et.stack([[0.0]], pad_to_buckets=buckets)


@pytest.mark.parametrize("kind", ["lists", "tensors", "arrays"])
def test_stack_refuses_items_of_different_shapes(kind: str) -> None:
    items = {"lists": lambda: [[1.0, 2.0], [1.0]], "tensors": lambda: [torch.zeros(3), torch.zeros(4)],
             "arrays": lambda: [np.zeros(2), np.zeros((2, 2))]}[kind]()
    with pytest.raises(ValueError, match="must have one shape"):
        et.stack(items)


def test_stack_needs_an_item() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        et.stack([])


def test_unstack_drops_the_padding() -> None:
    batch, n = et.stack([[float(i), 1.0] for i in range(3)], pad_to_buckets=(4,))
    rows = et.unstack(batch * 2, n)
    assert len(rows) == 3
    assert all(isinstance(r, torch.Tensor) and r.shape == (2,) for r in rows)
    assert [r.tolist() for r in rows] == [[0.0, 2.0], [2.0, 2.0], [4.0, 2.0]]
    assert et.unstack(batch[:, 0].long(), n, tolist=True) == [0, 1, 2]
    assert et.unstack(batch, 4, tolist=True)[3] == [0.0, 0.0]


@pytest.mark.parametrize("n", [-1, 5, 1.0, True])
def test_unstack_checks_n(n: object) -> None:
    with pytest.raises(ValueError, match="unstack"):
        et.unstack(torch.zeros(4, 2), n)  # type: ignore[arg-type]


def test_warm_up_is_the_shared_one() -> None:
    assert et.warm_up is ember.backends.warm_up


def test_a_real_host_allocation_failure_is_out_of_memory() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB
    assert et.is_out_of_memory(info.value)
    assert ember.backends.is_out_of_memory(info.value)


@pytest.mark.parametrize("exc", [
    "torch's OutOfMemoryError",  # built when the test runs: torch is imported then
    RuntimeError("CUDA error: out of memory"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
])
def test_cuda_out_of_memory_forms(exc: BaseException | str) -> None:
    if isinstance(exc, str):
        exc = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert et.is_out_of_memory(exc)
    assert ember.backends.is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
                                 ValueError("out of memory"), KeyError("x")])
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not et.is_out_of_memory(exc)


def test_out_of_memory_is_found_through_raise_from() -> None:
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except RuntimeError as exc:
            raise ember.RemoteError("batch failed") from exc
    except ember.RemoteError as wrapped:
        assert et.is_out_of_memory(wrapped)


def test_the_digits_example_predicts_as_before(digits: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # The example reads its weights from the digits-weights volume at /weights: here, as on a node that runs
    # replicas without a sandbox, that mount is the folder holding them.
    monkeypatch.setenv(VOLUMES_ENV, json.dumps({"/weights": str(DIGITS)}))
    classifier = importlib.import_module("classifier")
    schema = importlib.import_module("schema")
    images = [schema.Image(pixels=s["pixels"]) for s in SAMPLES]
    instance = classifier.Classifier()
    instance.load()
    predictions = instance.predict.local(images)
    net = digits.load(DIGITS / "weights.pt")  # the example's previous, hand-written forward
    with torch.inference_mode():
        confidence, label = torch.softmax(net(_pixels()), dim=1).max(dim=1)
    assert predictions == [schema.Prediction(label=int(lbl), confidence=round(float(c), 4))
                           for lbl, c in zip(label.tolist(), confidence.tolist(), strict=True)]
    assert [p.label for p in predictions] == [s["label"] for s in SAMPLES]
    assert instance.predict.local(images[:1]) == predictions[:1]


@pytest.mark.gpu
@pytest.mark.skipif("not cuda()", reason="needs an NVIDIA GPU and the CUDA build of torch")
def test_a_memory_share_caps_torchs_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_GPU_MEMORY_MB", "512")
    et.load_module(torch.nn.Linear(4, 4), device="cuda:0")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1024 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")  # 1 GiB > the 512 MB share
