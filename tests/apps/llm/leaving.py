"""A test subject: OpenAI-compatible models whose callers leave early. Each would run well past its client's patience
(and the generators past their 60 s deadline): the platform must end them when the client goes away. ``Leaver``
remembers which of its generators were closed; ``Steps`` which sequences each Continuous step ran."""

import threading
import time
from collections.abc import Iterator

import ember

app = ember.App("leaving")


@app.model(max_concurrency=4, timeout_s=60)
class Leaver:
    @ember.setup
    def start(self) -> None:
        self.closed: list[str] = []

    @ember.method(openai="leaving-chat")
    def chat(self, req: ember.openai.ChatRequest) -> Iterator[str]:
        yield from _endless(self, str(req.extra.get("tag", "")))

    @ember.method(openai="leaving-words")
    def words(self, req: ember.openai.CompletionRequest) -> Iterator[str]:
        yield from _endless(self, str(req.extra.get("tag", "")))

    @ember.method
    def closed_tags(self) -> list[str]:
        return list(self.closed)


def _endless(model: Leaver, tag: str) -> Iterator[str]:
    """A piece every 20 ms: chat's default of 4,096 pieces would take 82 s, past the deadline."""
    try:
        i = 0
        while True:
            yield f"w{i} "
            i += 1
            time.sleep(0.02)
    finally:
        model.closed.append(tag)


@app.model(timeout_s=60)
class Steps:
    """Each sequence gives ``int(prompt)`` pieces, then ends."""

    @ember.setup
    def start(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[list[str]] = []  # the tags of the sequences of each step

    @ember.method(openai="leaving-steps", batch=ember.Continuous(max_seqs=2))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        time.sleep(0.01)  # a decode step's pace
        with self.lock:
            self.steps.append([str(s.request.extra.get("tag", "")) for s in seqs])
        return [None if len(s.pieces) >= int(s.request.text()) else f"t{len(s.pieces)} " for s in seqs]

    @ember.method
    def history(self) -> list[list[str]]:
        with self.lock:
            return list(self.steps)
