"""A test subject for calls between functions: an app that ``fn-caller`` does not name, so may not call (but for
its public method)."""

import ember

app = ember.App("fn-private")


@app.model()
class Vault:
    @ember.method
    def secret(self, x: int) -> str:
        return f"secret {x}"

    @ember.method(public=True)
    def door(self, x: int) -> str:
        return f"door {x}"
