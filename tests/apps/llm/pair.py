"""A test subject: Continuous steps on several replicas, each piece naming the replica that made it.

``Pair`` runs on two replicas from the start (routing by running sequences); ``Grow`` on one that may become two
(autoscaling by running sequences against ``max_seqs``). Their sequences never end by themselves: ``max_tokens`` or
the caller leaving ends them."""

import sys
import time
import uuid

import ember

app = ember.App("llm-pair")


def _replica_id() -> str:
    """This replica's id, from its command line (``--replica-id``), else a token of its own."""
    argv = sys.argv
    return argv[argv.index("--replica-id") + 1] if "--replica-id" in argv else uuid.uuid4().hex


@app.model(min_replicas=2, max_replicas=2, timeout_s=300)
class Pair:
    @ember.setup
    def start(self) -> None:
        self.me = _replica_id()

    @ember.method(openai="pair", batch=ember.Continuous(max_seqs=8))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        time.sleep(0.02)
        return [f"{self.me} " for _ in seqs]


@app.model(min_replicas=1, max_replicas=2, timeout_s=300, scaledown_window_s=600)
class Grow:
    @ember.setup
    def start(self) -> None:
        self.me = _replica_id()

    @ember.method(openai="grow", batch=ember.Continuous(max_seqs=4))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        time.sleep(0.02)
        return [f"{self.me} " for _ in seqs]
