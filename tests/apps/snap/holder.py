"""An app whose import opens sockets and a pipe and keeps them in Python objects, as libraries do (a connection
pool, a multiprocessing pipe): built in a zygote, they are inherited by every replica forked from it."""

import gc
import os
import socket

import ember

app = ember.App("holder")
HELD: list = [*socket.socketpair(), *(os.fdopen(fd, "rb", buffering=0) for fd in os.pipe())]


@app.model(min_replicas=1, max_replicas=1)
class Holder:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.built_by = int(os.environ.get("EMBER_HOST_PID") or os.getpid())

    @ember.method
    def drop(self) -> dict:
        """Let go of what the import held: each object closes its descriptor, as its owner would."""
        numbers = [held.fileno() for held in HELD]
        for held in HELD:
            held.close()
        HELD.clear()
        gc.collect()
        return {"closed": numbers, "built_by": self.built_by, "pid": int(os.environ.get("EMBER_HOST_PID") or 0)}

    @ember.method
    def ping(self, i: int) -> int:
        return i
