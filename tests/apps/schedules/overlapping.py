"""A test subject for overlap: two functions on a 1 s period whose runs take 2.5 s. ``queued``'s ticks wait for the
run before them (overlap="queue"); ``allowed``'s run beside it (overlap="allow", four at once on its replica). Each
run prints its start and end with its call id (which names its tick)."""

import time

import ember

app = ember.App("overlapping")


def _run(name: str) -> None:
    call = ember.current_call()
    call_id = call.call_id if call is not None else "-"
    print(f"{name}-start {call_id}", flush=True)
    time.sleep(2.5)
    print(f"{name}-end {call_id}", flush=True)


@app.function(schedule=ember.Period(seconds=1, overlap="queue"), min_replicas=1, timeout_s=60)
def queued() -> None:
    _run("queued")


@app.function(schedule=ember.Period(seconds=1, overlap="allow"), min_replicas=1, max_concurrency=4, timeout_s=60)
def allowed() -> None:
    _run("allowed")
