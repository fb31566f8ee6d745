"""A test subject for events: a function bound to subjects that answers with its input's tag."""

import ember

app = ember.App("tagger")


@app.function(on="tagger.in.>", result_subject="tagger.out", retries=0)
def tag(event: dict) -> str:
    print(f"tag({event['tag']}) ran", flush=True)
    return event["tag"]
