"""A test subject for events: a function bound to subjects that answers with its input's tag."""

import ember

app = ember.App("tagger")


@app.function(on="events.tagger.in.>", result_subject="events.tagger.out", retries=0)
def tag(event: dict) -> str:
    print(f"tag({event['tag']}) ran", flush=True)
    return event["tag"]
