"""A test subject for queued calls whose runs end in errors with the codes the platform also uses for its own
refusals (``unavailable``, ``deadline_exceeded``): raised by the function, or let out of a call it made. And a slow
function on two replicas, for a drain while it runs."""

import time

import ember

app = ember.App("spawned-errors", calls=["never-ready"])


@app.function(timeout_s=30)
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.function(timeout_s=30, retries=0)
def via_unready(key: str) -> str:
    """Calls a function none of whose replicas becomes ready, and lets its ``unavailable`` out."""
    print(f"via_unready({key}) ran", flush=True)
    return ember.lookup("never-ready", "Sleeper.ping").with_options(timeout_s=1.0).remote()


@app.function(timeout_s=30, retries=0)
def via_slow(key: str) -> float:
    """Calls ``nap`` for longer than it gives it, and lets its ``deadline_exceeded`` out."""
    print(f"via_slow({key}) ran", flush=True)
    return ember.lookup("spawned-errors", "nap").with_options(timeout_s=1.0).remote(3.0)


@app.function(timeout_s=30, retries=ember.Retries(max_retries=1, initial_delay_s=0.1))
def refuses(key: str) -> int:
    """Raises ``unavailable`` itself, as a model whose dependency is down would."""
    print(f"refuses({key}) ran", flush=True)
    raise ember.UnavailableError("the model's store is down", retry_after_s=1.0)


@app.function(timeout_s=60, min_replicas=2, max_replicas=2)
def linger(key: str, seconds: float) -> str:
    print(f"linger({key}) started", flush=True)
    time.sleep(seconds)
    print(f"linger({key}) ended", flush=True)
    return key
