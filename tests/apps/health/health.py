"""A test subject for ``@ember.health``: ``Checked``'s check raises once ``break_it`` was called (three times in a
row before its replica gives way, the default), ``Hung``'s never returns once ``hang`` was (once is enough); ``who``
names the replica's setup, and teardown prints it."""

import threading
import time

import ember

app = ember.App("health")


@app.model(min_replicas=1, timeout_s=30)
class Checked:
    @ember.setup
    def open(self) -> None:
        self.name = f"checked-{time.time_ns()}"
        self.broken = False

    @ember.method()
    def who(self) -> str:
        return self.name

    @ember.method()
    def break_it(self) -> str:
        self.broken = True
        return self.name

    @ember.health(every_s=0.5, timeout_s=5)
    def device_ok(self) -> bool:
        if self.broken:
            raise RuntimeError(f"device lost under {self.name}")
        return True

    @ember.teardown
    def close(self) -> None:
        print(f"teardown {self.name}", flush=True)


@app.model(min_replicas=1, timeout_s=30)
class Hung:
    @ember.setup
    def open(self) -> None:
        self.name = f"hung-{time.time_ns()}"
        self.stuck = threading.Event()

    @ember.method()
    def who(self) -> str:
        return self.name

    @ember.method()
    def hang(self) -> str:
        self.stuck.set()
        return self.name

    @ember.health(every_s=0.5, timeout_s=1, failures=1)
    def alive(self) -> None:
        if self.stuck.is_set():
            threading.Event().wait()  # never returns: the check times out
