"""A replica that prints far more than a pipe holds on one line, and one that starts processes of its own."""

import subprocess

import ember

app = ember.App("wedge")


@app.function()
def shout(n: int) -> int:
    print("z" * n, flush=True)  # one line of n bytes on stdout
    return n


@app.function()
def spawn_child() -> int:
    return subprocess.Popen(["sleep", "600"]).pid  # in the replica's process group


@app.function(timeout_s=2, min_replicas=1, max_replicas=2)
def nap(seconds: float) -> float:
    import time

    time.sleep(seconds)  # past timeout_s the gateway answers 504, and this thread cannot be interrupted
    return seconds


@app.function(min_replicas=2, max_replicas=2, timeout_s=60)
def linger(seconds: float) -> float:
    import time

    time.sleep(seconds)  # holds its replica's drain when the app is deleted
    return seconds
