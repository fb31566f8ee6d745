"""A test subject for ``@ember.teardown``: a model whose teardown prints what its setup made, and one whose first
teardown raises (the second still runs). ``work`` takes a while, so that a stop can come while it runs."""

import time

import ember

app = ember.App("teardown")


@app.model(min_replicas=1, timeout_s=60)
class Held:
    @ember.setup
    def open(self) -> None:
        self.resource = f"resource-{time.time_ns()}"
        print(f"setup {self.resource}", flush=True)

    @ember.method()
    def work(self, seconds: float) -> str:
        print(f"work-start {self.resource}", flush=True)
        time.sleep(seconds)
        print(f"work-end {self.resource}", flush=True)
        return self.resource

    @ember.teardown
    def close(self) -> None:
        print(f"teardown {self.resource}", flush=True)


@app.model(min_replicas=1, timeout_s=60)
class Faulty:
    @ember.setup
    def open(self) -> None:
        self.resource = f"faulty-{time.time_ns()}"

    @ember.method()
    def ping(self) -> str:
        return self.resource

    @ember.teardown
    def broken(self) -> None:
        raise RuntimeError(f"cannot close {self.resource}")

    @ember.teardown
    def after(self) -> None:
        print(f"teardown-after {self.resource}", flush=True)
