"""A test subject: OpenAI-compatible models, a plain generator and a Continuous step that records its steps."""

import threading
import time
from collections.abc import Iterator

import ember

app = ember.App("llm")


@app.model(max_concurrency=16, timeout_s=60)
class Words:
    """Generators of text pieces in one replica, which remembers which of its generators were closed."""

    @ember.setup
    def start(self) -> None:
        self.closed: list[str] = []

    @ember.method(openai="echo-words")
    def echo(self, req: ember.openai.ChatRequest) -> Iterator[str]:
        for word in req.messages[-1].content.split():
            yield word + " "

    @ember.method(openai="small-body", max_body_bytes=4096)
    def small(self, req: ember.openai.CompletionRequest) -> Iterator[str]:
        yield f"{len(req.text())} "

    @ember.method(openai="big-body", max_body_bytes=6 * 1024 * 1024)
    def big(self, req: ember.openai.ChatRequest) -> Iterator[str]:
        yield f"{len(req.text())} "

    @ember.method(openai="forever")
    def forever(self, req: ember.openai.CompletionRequest) -> Iterator[str]:
        tag = str(req.extra.get("tag", ""))
        try:
            i = 0
            while True:
                yield f"w{i} "
                i += 1
                time.sleep(0.01)
        finally:
            self.closed.append(tag)

    @ember.method
    def closed_tags(self) -> list[str]:
        return list(self.closed)


@app.model(timeout_s=60)
class Counter:
    """A decoder's stand-in under continuous batching: each sequence gives ``int(prompt)`` pieces, then ends."""

    @ember.setup
    def start(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[list[str]] = []  # the tags of the sequences of each step
        self.finished: list[str] = []  # tags, in the order their sequences ended by themselves

    @ember.method(openai="counter", batch=ember.Continuous(max_seqs=4))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        return _count(self, seqs)

    @ember.method
    def history(self) -> dict[str, list]:
        with self.lock:
            return {"steps": list(self.steps), "finished": list(self.finished)}


@app.model(timeout_s=60)
class WideCounter:
    """The same stand-in with room for many sequences: a new one joins whenever it comes."""

    @ember.setup
    def start(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[list[str]] = []
        self.finished: list[str] = []

    @ember.method(openai="wide-counter", batch=ember.Continuous(max_seqs=32))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        return _count(self, seqs)

    @ember.method
    def history(self) -> dict[str, list]:
        with self.lock:
            return {"steps": list(self.steps), "finished": list(self.finished)}


def _count(model: Counter | WideCounter, seqs: list[ember.Sequence]) -> list[str | None]:
    time.sleep(0.01)  # a decode step's pace
    out: list[str | None] = []
    with model.lock:
        model.steps.append([str(s.request.extra.get("tag", "")) for s in seqs])
        for seq in seqs:
            if seq.state is None:
                seq.state = int(seq.request.text())
            if len(seq.pieces) >= seq.state:
                model.finished.append(str(seq.request.extra.get("tag", "")))
                out.append(None)
            else:
                out.append(f"t{len(seq.pieces)} ")
    return out


@app.model(timeout_s=30)
class Embedder:
    """Embedding models in one replica: each text as [characters, words, 1], or as many of them as ``dimensions``
    asks; a batched one; and one that gives a single vector whatever it is asked."""

    @ember.method(openai="word-stats")
    def stats(self, req: ember.openai.EmbeddingRequest) -> list[list[float]]:
        vectors = [[float(len(text)), float(len(text.split())), 1.0] for text in req.texts]
        return [vector[: req.dimensions] for vector in vectors] if req.dimensions else vectors

    @ember.method(openai="word-stats-batched", batch=ember.Batch(max_size=8, window_ms=20))
    def batched(self, reqs: list[ember.openai.EmbeddingRequest]) -> list[list[list[float]]]:
        return [[[float(len(text)), float(len(text.split()))] for text in req.texts] for req in reqs]

    @ember.method(openai="one-vector")
    def one(self, req: ember.openai.EmbeddingRequest) -> list[list[float]]:
        return [[1.0]]
