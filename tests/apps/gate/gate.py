"""A public endpoint (``public=True``): its synchronous call needs no token; its spawn, its calls, its logs and the
rest of the app still do."""

import ember

app = ember.App("gate")


@app.function(public=True)
def ping(name: str) -> str:
    print(f"pinged by {name}")
    return f"pong {name}"
