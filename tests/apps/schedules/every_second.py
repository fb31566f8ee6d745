"""A test subject for a failover: a 1 s period whose missed ticks all run (catch_up="all", overlap="allow"), each run
printing its call id (which names its tick)."""

import ember

app = ember.App("every-second")


@app.function(schedule=ember.Period(seconds=1, catch_up="all", overlap="allow"), min_replicas=1)
def beat() -> None:
    call = ember.current_call()
    print(f"beat {call.call_id if call is not None else '-'}", flush=True)
