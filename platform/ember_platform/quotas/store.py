"""The quota store: records in the ``ember_quotas`` bucket, mirrored in memory by every control plane, and the
limiter that admits calls against them (rate and concurrency are counted per control plane)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from ember._errors import NotFoundError, UnavailableError
from ember.wire import encoder
from ember.wire.jetstream import KVMirror
from ember.wire.quotas import Quota, QuotaRequest
from ember_platform.quotas.limiter import Limiter
from ember_platform.quotas.rules import check_request

log = logging.getLogger("ember.quotas")
_decoder = msgspec.json.Decoder(Quota)


class QuotaStore:
    def __init__(self, kv: KeyValue, clock: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self.limiter = Limiter(clock)
        self.mirror: KVMirror[Quota] = KVMirror(kv, _decoder.decode, on_change=lambda _key, _value: self._sync(),
                                               heal=encoder.encode)

    async def start(self) -> None:
        await self.mirror.start()
        self._sync()

    async def stop(self) -> None:
        await self.mirror.stop()

    def all(self) -> list[Quota]:
        return sorted(self.mirror.items.values(), key=lambda q: q.name)

    async def put(self, name: str, request: QuotaRequest, by: str) -> Quota:
        """Set the quota ``name`` (checked: 422 naming the field); it applies here at once, on other control
        planes once their watch delivers it."""
        quota = check_request(name, request, now=time.time(), by=by)
        revision = await self._write(name, lambda: self._kv.put(name, encoder.encode(quota)))
        self.mirror.record(name, quota, revision)
        self._sync()
        log.info("quota %s set by %s: %s", name, by or "-", encoder.encode(request).decode())
        return quota

    async def delete(self, name: str, by: str) -> Quota:
        quota = self.mirror.items.get(name)
        if quota is None:
            known = ", ".join(sorted(self.mirror.items)) or "none"
            raise NotFoundError(f"no quota named {name!r} (quotas: {known})")
        await self._write(name, lambda: self._kv.delete(name))
        self.mirror.items.pop(name, None)  # the watch delivers the deletion too, with its revision
        self._sync()
        log.info("quota %s removed by %s", name, by or "-")
        return quota

    async def _write(self, name: str, write: Callable[[], Awaitable[object]]) -> int:
        try:
            result = await write()
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"quota {name} could not be stored ({type(exc).__name__}: {exc}); the "
                                   "ember_quotas bucket may be full (EMBER_QUOTAS_KV_MAX_BYTES)",
                                   retry_after_s=1.0) from exc
        return int(result) if isinstance(result, int) else 0

    def _sync(self) -> None:
        self.limiter.set(self.mirror.items.values())
