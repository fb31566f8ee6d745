"""A queue-fed batch job: reviews arrive on a durable queue (spawned calls, or events published to a subject) and a
batched function scores them several at a time.

    ember dev examples/batch_queue/app.py
    curl -H "Authorization: Bearer $EMBER_TOKEN" -d '{"id": "r1", "text": "great value, love it"}' \
         $EMBER_URL/v1/batch-queue/score/spawn                    # {"call_id": ...}; then GET /v1/calls/<id>
    curl -H "Authorization: Bearer $EMBER_TOKEN" -H 'Idempotency-Key: r2' -d '{"id": "r2", "text": "broken, awful"}' \
         $EMBER_URL/v1/events/events.batch-queue.reviews.shop      # an event; its score goes to the result subject

Every queued input waits in JetStream until a replica pulls it; the replica's batcher gathers up to ``max_size``
of them (or what came within ``window_ms``) into one call of ``score``, which answers each in order.
"""

import msgspec

import ember

app = ember.App("batch-queue")

POSITIVE = {"good", "great", "love", "excellent", "fast", "value", "perfect", "nice"}
NEGATIVE = {"bad", "awful", "broken", "slow", "hate", "poor", "refund", "late"}


class Review(msgspec.Struct):
    id: str
    text: str


class Score(msgspec.Struct):
    id: str
    label: str
    score: int
    batch_size: int  # how many reviews this one was scored with


@app.function(batch=ember.Batch(max_size=16, window_ms=20), on="events.batch-queue.reviews.>",
              result_subject="events.batch-queue.scores", retries=2)
def score(reviews: list[Review]) -> list[Score]:
    """One call for a whole batch: a list in, a list of the same length out, in the same order."""
    out = []
    for review in reviews:
        words = [w.strip(".,!?").lower() for w in review.text.split()]
        n = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
        label = "positive" if n > 0 else "negative" if n < 0 else "neutral"
        out.append(Score(id=review.id, label=label, score=n, batch_size=len(reviews)))
    return out
