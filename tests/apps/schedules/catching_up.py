"""A test subject for catch_up after the control planes were down: the same 30 s period with catch_up="latest" and
"none", and a 1 s period with catch_up="latest". No replica is kept: a tick's queued call is what the tests look at
(overlap="allow", so that a tick never waits for the run before it)."""

import ember

app = ember.App("catching-up")


@app.function(schedule=ember.Period(seconds=30, catch_up="latest", overlap="allow"), min_replicas=0)
def latest() -> None: ...


@app.function(schedule=ember.Period(seconds=30, catch_up="none", overlap="allow"), min_replicas=0)
def none() -> None: ...


@app.function(schedule=ember.Period(seconds=1, catch_up="latest", overlap="allow"), min_replicas=0)
def often() -> None: ...
