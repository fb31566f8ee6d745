"""A test subject for cancelling running calls: each kind of function notes what happens to it (started, cancelled,
closed, noticed) in its replica, and ``Stoppable.events``/``Kid.events`` answer the notes."""

import asyncio
import time

import ember

app = ember.App("cancels")
NOTES: list[str] = []  # per replica process: each class model below is a service with a replica of its own


@app.model(timeout_s=120)
class Stoppable:
    @ember.method
    async def events(self) -> list[str]:
        return NOTES

    @ember.method
    async def spin_async(self, tag: str) -> str:
        NOTES.append(f"started:{tag}")
        try:
            while True:
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            NOTES.append(f"cancelled:{tag}")
            raise

    @ember.method
    def spin_sync(self, tag: str) -> str:
        NOTES.append(f"started:{tag}")
        call = ember.current_call()
        assert call is not None
        while not call.cancelled.wait(0.02):
            pass
        NOTES.append(f"noticed:{tag}")
        return "stopped"

    @ember.method
    def items(self, tag: str):
        try:
            for i in range(100_000):
                NOTES.append(f"item:{tag}:{i}")
                yield i
                time.sleep(0.02)
        finally:
            NOTES.append(f"closed:{tag}")

    @ember.method(batch=ember.Batch(max_size=4, window_ms=500))
    def batched(self, tags: list[str]) -> list[str]:
        NOTES.append(f"batch:{','.join(sorted(tags))}")
        call = ember.current_call()
        assert call is not None
        call.cancelled.wait(3.0)  # a batch with some calls left runs on (set only once all are cancelled)
        return [f"done:{t}" for t in tags]

    @ember.method(batch=ember.Batch(max_size=4, window_ms=500))
    def batch_parent(self, tags: list[str]) -> list[str]:
        """A batch of two or more waits on one ``Kid.spin`` for all its calls: it runs until every one is cancelled."""
        call = ember.current_call()
        assert call is not None
        if len(tags) < 2:  # (a batch starts at once when the replica is idle: the calls after this one make one)
            call.cancelled.wait(1.0)
            return tags
        kid = "-".join(sorted(tags))
        NOTES.append(f"batch-parent:{kid}:{call.call_id}")
        try:
            return [ember.lookup("cancels", "Kid.spin").remote(kid)] * len(tags)
        except ember.EmberError as exc:
            NOTES.append(f"batch-child-ended:{kid}:{exc.code}")
            raise

    @ember.method
    def parent(self, tag: str) -> str:
        """Waits on ``Kid.spin``: cancelling this call cancels that one."""
        NOTES.append(f"started:{tag}")
        try:
            return ember.lookup("cancels", "Kid.spin").remote(tag)
        except ember.EmberError as exc:
            NOTES.append(f"child-ended:{tag}:{exc.code}")
            raise

    @ember.method
    def late_parent(self, tag: str) -> str:
        """Calls ``Kid.spin`` only once its own call is cancelled (sync code that goes on): the call is refused."""
        NOTES.append(f"started:{tag}")
        call = ember.current_call()
        assert call is not None
        call.cancelled.wait(60)
        try:
            return ember.lookup("cancels", "Kid.spin").remote(tag)
        except ember.EmberError as exc:
            NOTES.append(f"late-call-ended:{tag}:{exc.code}")
            raise

    @ember.method
    async def aparent(self, tag: str) -> str:
        """``parent`` as an ``async def``: its task is cancelled where it awaits ``Kid.spin`` (or, should the child's
        cancel answer first, ``remote.aio`` raises ``CallCancelledError``)."""
        NOTES.append(f"started:{tag}")
        try:
            return await ember.lookup("cancels", "Kid.spin").remote.aio(tag)
        finally:
            NOTES.append(f"parent-ended:{tag}")

    @ember.method
    def gen_parent(self, tag: str):
        """A generator that waits on ``Kid.spin`` after its first item."""
        NOTES.append(f"started:{tag}")
        yield 0
        try:
            yield ember.lookup("cancels", "Kid.spin").remote(tag)
        except ember.EmberError as exc:
            NOTES.append(f"child-ended:{tag}:{exc.code}")
            raise


@app.model(timeout_s=120)
class Kid:
    @ember.method
    async def events(self) -> list[str]:
        return NOTES

    @ember.method
    async def spin(self, tag: str) -> str:
        NOTES.append(f"started:{tag}")
        try:
            while True:
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            NOTES.append(f"cancelled:{tag}")
            raise


@app.model(timeout_s=300)
class Stubborn:
    @ember.method
    def forever(self, tag: str) -> str:
        """Never looks at ``cancelled``: only ``terminate`` stops it."""
        while True:
            time.sleep(0.05)

    @ember.method
    def quick(self, x: int) -> int:
        return x
