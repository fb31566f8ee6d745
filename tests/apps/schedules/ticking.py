"""A test subject for schedules: each run prints its call id (a tick's id says which tick it ran), ``slow`` runs
longer than its period (overlap="skip"), ``beat`` is paused, resumed and run now by the tests."""

import time

import ember

app = ember.App("ticking")


def _say(what: str) -> None:
    call = ember.current_call()
    print(f"{what} {call.call_id if call is not None else '-'}", flush=True)


@app.function(schedule=ember.Period(seconds=1), min_replicas=1)
def beat() -> None:
    _say("beat")


@app.function(schedule=ember.Period(seconds=1, overlap="skip"), min_replicas=1, timeout_s=60)
def slow() -> None:
    _say("slow-start")
    time.sleep(2.5)
    _say("slow-end")
