"""examples/tiny_gpt's step, in process with real torch: sequences that join and leave a batched step get the same
text as each alone (their slots of the one preallocated KV cache, masked to their lengths, change nothing), and the
slots of sequences that left are used again."""

from __future__ import annotations

import importlib.util

from support.paths import REPO

import ember
from ember._app import method_def
from ember._setup import run_setup
from ember.wire.openai import CompletionRequest


def _module():
    spec = importlib.util.spec_from_file_location("tiny_gpt_app", REPO / "examples" / "tiny_gpt" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model():
    module = _module()
    instance = module.TinyGPT()
    run_setup(instance, snap=False)
    return method_def(module.TinyGPT, "step").raw.__get__(instance)


def _seq(prompt: str) -> ember.Sequence:
    return ember.Sequence(CompletionRequest(model="tiny-gpt", prompt=prompt))


def _take(seqs: list[ember.Sequence], pieces: list[str | None]) -> None:
    for seq, piece in zip(seqs, pieces, strict=True):
        assert isinstance(piece, str) and len(piece) == 1
        seq.pieces.append(piece)


def test_joining_and_leaving_sequences_decode_as_alone():
    step = _model()
    alone = {}
    for prompt in ("Hello", "Hi there, friend", ""):
        seq = _seq(prompt)
        for _ in range(12):
            _take([seq], step([seq]))
        alone[prompt] = seq.text
        seq.done = True  # it leaves: its slot is free
    first, second, third = _seq("Hello"), _seq("Hi there, friend"), _seq("")
    for _ in range(3):
        _take([first], step([first]))
    for _ in range(5):
        _take([first, second], step([first, second]))
    for _ in range(4):
        _take([first, second, third], step([first, second, third]))  # first leaves after this
    first.done = True
    for _ in range(3):
        _take([second, third], step([second, third]))
    for _ in range(5):
        _take([third], step([third]))
    assert [first.text, second.text, third.text] == [alone["Hello"], alone["Hi there, friend"], alone[""]]
    assert len(set(alone.values())) == 3


def test_sequences_joining_together_prefill_as_alone():
    """Prompts of different lengths read in one padded prefill give the text each gives alone."""
    step = _model()
    prompts = ("Hello", "Hi there, friend", "", "a much longer prompt than the others")
    alone = {}
    for prompt in prompts:
        seq = _seq(prompt)
        for _ in range(8):
            _take([seq], step([seq]))
        alone[prompt] = seq.text
        seq.done = True
    together = [_seq(p) for p in prompts]
    for _ in range(8):
        _take(together, step(together))
    assert [s.text for s in together] == [alone[p] for p in prompts]


def test_the_slots_of_sequences_that_left_are_used_again():
    """Three times more sequences over time than the cache has slots, one joining at each step and each leaving
    after six: each decodes as it does alone. While every slot is held, a new sequence ends at once (the replica
    never runs more than ``max_seqs``)."""
    slots = _module().MAX_SEQS
    step = _model()
    alone = _seq("reuse")
    for _ in range(6):
        _take([alone], step([alone]))
    alone.done = True
    running: list[ember.Sequence] = []
    for _ in range(3 * slots):
        running.append(_seq("reuse"))
        _take(running, step(running))
        for seq in [s for s in running if len(s.pieces) == 6]:
            assert seq.text == alone.text
            seq.done = True
            running.remove(seq)
    held = [_seq(str(i)) for i in range(slots - len(running))]
    _take(held, step(held))
    assert step([_seq("one too many")]) == [None]
