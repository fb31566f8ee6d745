"""A test subject: functions that expose the platform's behaviour (batching, errors, deadlines, setup)."""

import os
import time

import msgspec

import ember

app = ember.App("probe")


class Item(msgspec.Struct):
    n: int


@app.function(batch=ember.Batch(max_size=16, window_ms=50))
def sizes(items: list[Item]) -> list[int]:
    """Answers each call with the size of the batch it ran in; slow enough that concurrent calls queue."""
    time.sleep(0.05)
    return [len(items)] * len(items)


@app.function(batch=ember.Batch(max_size=8, window_ms=50))
def pad(items: list[int]) -> list[str]:
    """Answers each call with that many MiB of text, slowly enough that calls sent meanwhile queue and run
    together in the next batch (whose answers then outgrow one NATS message)."""
    time.sleep(0.3)
    return ["x" * (n * 1024 * 1024) for n in items]


@app.function()
def pid() -> int:
    return int(os.environ.get("EMBER_HOST_PID") or os.getpid())  # in a sandbox: its pid on the node


@app.function()
def slow(seconds: float) -> float:
    print(f"slow({seconds}) started", flush=True)
    time.sleep(seconds)
    return seconds


@app.function()
def nap(seconds: float) -> float:
    """``slow`` for the deadline test alone: no other test's calls teach its replica how long it takes (a replica
    refuses at once, 429, a call it predicts to end after its deadline)."""
    time.sleep(seconds)
    return seconds


@app.function()
def boom(message: str) -> str:
    raise ValueError(message)


@app.function(batch=ember.Batch(max_size=8, window_ms=1))
def wrong_length(items: list[int]) -> list[int]:
    return items[:-1]


@app.model(timeout_s=5)
class Counter:
    @ember.setup
    def start(self) -> None:
        self.setups = getattr(self, "setups", 0) + 1

    @ember.method()
    def setups_run(self) -> int:
        return self.setups


@app.function(retries=ember.Retries(max_retries=2, initial_delay_s=0.1))
def flaky(tag: str) -> str:
    """Fails every time for a tag starting with "poison"."""
    print(f"flaky({tag}) ran", flush=True)
    if tag.startswith("poison"):
        raise RuntimeError(f"poisoned {tag}")
    return tag


@app.function(batch=ember.Batch(max_size=8, window_ms=20))
def work(items: list[Item]) -> list[int]:
    """A batched job slow enough to be interrupted; logs each input it runs."""
    for item in items:
        print(f"work({item.n}) ran", flush=True)
    time.sleep(0.4)
    return [item.n * 2 for item in items]


@app.function(min_replicas=2)
def whoami() -> int:
    """Which replica answered (its pid); two replicas share the load."""
    time.sleep(0.02)
    return int(os.environ.get("EMBER_HOST_PID") or os.getpid())  # in a sandbox: its pid on the node


@app.function()
def big(kib: int) -> str:
    """A result larger than a KV entry holds: it is stored in the object store."""
    return "x" * (kib * 1024)
