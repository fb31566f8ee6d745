"""A local, always-current copy of a KV bucket (``KVMirror``), and the reads of a bucket's whole state.

nats-py's watcher says its initial values are all there (a None entry) when its consumer reports nothing pending and
its callback has handled none, asked right after the consumer was made: when the server had already pushed every
value and the callback had not run yet, the None came first, before any value (seen here once in 200 watches of a
one-key bucket). A mirror then said it was in sync while empty (a control plane starting saw no deployment), and a
read of the deployments' history found none (the bundle collector would have taken every kept version's bundle for
unused). So the initial state is taken as whole only once the values seen reach the stream's last sequence as it
was before the watch began (``last_sequence``), or, should that one have expired meanwhile, ``SETTLE_S`` after the
None.

A value that no writer of a bucket wrote (a server's answer stored under a key through a request's reply subject:
NATS checks no permission on a reply subject, so any client that may publish to a stream can have JetStream's
acknowledgement written under any key of the account) is not taken: the key keeps the value last seen. A mirror
given ``heal`` (the control planes', of the buckets they alone write) writes that value back over it, compare-and-set
on the spoiled revision, so that a process that starts later reads the good value, not the spoiled one: only over a
server's answer (``server_answer``: empty, or JetStream's JSON), never over a value of another shape a writer may have
meant (a newer control plane's), and only a value this watch saw last (after a watch restarts, a value seen before
it may have been replaced meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from ember._loop import cancel_and_wait

log = logging.getLogger("ember.nats")
T = TypeVar("T")
SETTLE_S = 2.0  # after the watcher's None, how long the values up to the last sequence are waited for at most


async def last_sequence(kv: KeyValue) -> int:
    """The sequence of the last value ``kv`` holds (0 when it holds none, or when its stream may not be asked
    about: the watcher's None is then taken at its word): what a watch started now must reach."""
    try:
        state = (await kv.status()).stream_info.state
    except Exception as exc:  # (a client whose permissions name no stream info)
        log.debug("cannot ask about %s's stream (%s): its watch's None is taken as said", kv._name, exc)
        return 0
    return int(state.last_seq or 0) if state.messages else 0


class KVMirror(Generic[T]):
    """A local, always-current copy of a KV bucket, kept by a watcher task that this object owns."""

    def __init__(self, kv: KeyValue, decode: Callable[[bytes], T],
                 on_change: Callable[[str, T | None], None] | None = None,
                 heal: Callable[[T], bytes] | None = None) -> None:
        self._kv = kv
        self._decode = decode
        self._on_change = on_change
        self._heal = heal  # encodes a value as its writers do, to write it back over a spoiled one
        self._healing: set[asyncio.Task[None]] = set()
        self._current: set[str] = set()  # the keys whose value this watch delivered (or this process wrote) last
        self.items: dict[str, T] = {}
        self.generation = 0  # bumped by every change of ``items``: what is derived from them is stale once it moves
        self._revisions: dict[str, int] = {}
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-mirror-{self._kv._name}")
        await self._synced.wait()

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)
        for task in list(self._healing):
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            watcher = None
            settle: asyncio.TimerHandle | None = None
            try:
                last, seen, marked = await last_sequence(self._kv), 0, False
                self._current.clear()
                watcher = await self._kv.watchall()
                async for entry in watcher:
                    if entry is None:
                        marked = True
                        settle = asyncio.get_running_loop().call_later(SETTLE_S, self._synced.set)
                    else:
                        self._apply(entry)
                        seen = max(seen, entry.revision or 0)
                    if marked and seen >= last:  # the whole initial state (see the module's docstring)
                        self._synced.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV watch on %s failed; restarting it", self._kv._name)
                await asyncio.sleep(0.5)
            finally:
                if settle is not None:
                    settle.cancel()
                if watcher is not None:
                    await asyncio.shield(_quiet_stop(watcher))

    def revision(self, key: str) -> int:
        """The revision of ``key`` as last seen (0: none), for a compare-and-set ``update``."""
        return self._revisions.get(key, 0)

    def record(self, key: str, value: T | None, revision: int) -> None:
        """Apply this process's own write at once (read-your-writes); older watch updates are then skipped."""
        if revision < self._revisions.get(key, 0):
            return
        self._revisions[key] = revision
        self._current.add(key)
        self.generation += 1
        if value is None:
            self.items.pop(key, None)
        else:
            self.items[key] = value

    def _apply(self, entry: KeyValue.Entry) -> None:
        value: T | None = None
        if entry.revision is not None and entry.revision < self._revisions.get(entry.key, 0):
            return
        if entry.operation in (KV_DEL, KV_PURGE):
            self.record(entry.key, None, entry.revision or 0)
        elif not entry.value:  # no deletion: a server's empty answer to a request whose reply subject named the key
            self._spoiled(entry, "an empty value (not a deletion)")
            return
        else:
            try:
                value = self._decode(entry.value)
            except Exception:
                self._spoiled(entry, "an undecodable value")
                return
            self.record(entry.key, value, entry.revision or 0)
        if self._on_change:
            self._on_change(entry.key, value)
        self.changed.set()

    def _spoiled(self, entry: KeyValue.Entry, what: str) -> None:
        """``entry`` holds what no writer of the bucket wrote: ignored; with ``heal``, the value last seen is written
        back over it."""
        log.warning("ignoring %s of %s/%s", what, self._kv._name, entry.key)
        good = self.items.get(entry.key)
        if self._heal is None or good is None or entry.revision is None or entry.key not in self._current \
                or not server_answer(entry.value):
            return
        task = asyncio.ensure_future(self._write_back(entry.key, self._heal(good), entry.revision))
        self._healing.add(task)
        task.add_done_callback(self._healing.discard)

    async def _write_back(self, key: str, raw: bytes, spoiled: int) -> None:
        try:
            await self._kv.update(key, raw, last=spoiled)
        except KeyWrongLastSequenceError:
            return  # written since: by its writer, or healed by another control plane
        except Exception as exc:
            log.warning("could not write %s/%s back over its spoiled value: %s", self._kv._name, key, exc)
            return
        log.warning("wrote %s/%s back over a value no writer of it wrote", self._kv._name, key)


def server_answer(raw: bytes | None) -> bool:
    """Whether ``raw`` is what NATS answers a request with, not a value a writer wrote: empty (a pull's "no
    messages"), a publish's acknowledgement (``{"stream": ..., "seq": ...}``) or a JetStream API response."""
    if not raw:
        return True
    try:
        answer = json.loads(raw)
    except ValueError:
        return False
    return isinstance(answer, dict) and (("stream" in answer and "seq" in answer) or
                                         str(answer.get("type", "")).startswith("io.nats.jetstream.api."))


async def _quiet_stop(watcher: Any) -> None:
    with contextlib.suppress(Exception):
        await watcher.stop()
