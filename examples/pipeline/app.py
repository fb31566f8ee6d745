"""A function calling another: ``report`` asks ``words`` for a text's words, then sums them up.

    ember dev examples/pipeline/app.py
    ember call pipeline.report --data '"the quick brown fox jumps over the lazy dog"'

Inside a replica, ``words.remote(...)`` goes over the replica's own NATS connection, checked and routed by the
platform as an HTTP call is (no URL or token needed), and carries the caller's deadline. To call another app's
functions, name it: ``ember.App("pipeline", calls=["other-app"])`` and ``ember.lookup("other-app", "fn")``.
"""

import collections

import ember

app = ember.App("pipeline")


@app.function()
def words(text: str) -> list[str]:
    """The first stage: the text's words, lower-cased, without punctuation."""
    return [w.strip(".,;:!?\"'()").lower() for w in text.split() if w.strip(".,;:!?\"'()")]


@app.function(timeout_s=30)
def report(text: str) -> dict:
    """The second stage: calls ``words`` (another function, its own replicas) and counts what it answers."""
    found = words.remote(text)
    call = ember.current_call()
    counts = collections.Counter(found)
    return {"words": len(found), "distinct": len(counts), "most_common": counts.most_common(3),
            "call_id": call.call_id if call else None}
