"""A test subject for whose error a call's end is: functions raising the codes the platform also uses for its own
refusal and expiry (``unavailable``, ``deadline_exceeded``), each counting its runs in its log; and an endless
generator, past any client's patience, that remembers which of its runs were closed."""

import time
from collections.abc import Iterator

import ember

app = ember.App("attempts")


@app.function(timeout_s=60)
def refuses(key: str) -> int:
    """Raises ``unavailable`` itself, as a model whose dependency is down would."""
    print(f"refuses({key}) ran", flush=True)
    raise ember.UnavailableError("the model's store is down", retry_after_s=2.0)


@app.function(timeout_s=60, retries=0)
def gives_up(key: str) -> int:
    """Raises ``deadline_exceeded`` itself, long before its own deadline, as a call it made that timed out would
    (``.remote()`` with no answer from the control plane in time raises it in the function's code)."""
    print(f"gives_up({key}) ran", flush=True)
    raise ember.DeadlineExceededError("no answer from the control plane within 1s")


@app.model(max_concurrency=4, timeout_s=300)
class Ticker:
    @ember.setup
    def start(self) -> None:
        self.closed: list[str] = []

    @ember.method
    def ticks(self, tag: str) -> Iterator[int]:
        """Endless, an item every 20 ms; notes ``tag`` once closed (only its deadline, 300 s, would end it)."""
        try:
            i = 0
            while True:
                yield i
                i += 1
                time.sleep(0.02)
        finally:
            self.closed.append(tag)

    @ember.method
    def closed_tags(self) -> list[str]:
        return list(self.closed)
