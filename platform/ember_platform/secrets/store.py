"""The secret store: records in the ``ember_secrets`` bucket, their values a Fernet token under the control
plane's key, mirrored in memory (still encrypted) by every control plane. Values are decrypted only to answer a
node agent (``server``), and are never logged."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import msgspec
from cryptography.fernet import Fernet, InvalidToken
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from ember._errors import InvalidInputError, NotFoundError, UnavailableError
from ember.wire import encoder
from ember.wire.jetstream import KVMirror
from ember.wire.secrets import SecretView, StoredSecret
from ember_platform.secrets.checks import check_name, check_values
from ember_platform.secrets.key import KEY_SETTING

log = logging.getLogger("ember.secrets")
_decoder = msgspec.json.Decoder(StoredSecret)
_values = msgspec.json.Decoder(dict[str, str])


class SecretStore:
    def __init__(self, kv: KeyValue, fernet: Fernet | None) -> None:
        self._kv = kv
        self._fernet = fernet
        self.mirror: KVMirror[StoredSecret] = KVMirror(kv, _decoder.decode)

    async def start(self) -> None:
        await self.mirror.start()

    async def stop(self) -> None:
        await self.mirror.stop()

    @property
    def fernet(self) -> Fernet:
        """The key's Fernet, or 503 naming the setting that gives one."""
        if self._fernet is None:
            raise UnavailableError(f"secrets are off: this control plane has no secrets key ({KEY_SETTING}, a file "
                                   "of mode 0600 holding a Fernet key)")
        return self._fernet

    def require_key(self) -> None:
        """Nothing, or the 503 of a control plane without a secrets key (every secrets route answers it)."""
        self.fernet  # noqa: B018 - the property raises

    def views(self) -> list[SecretView]:
        return [view(s) for s in sorted(self.mirror.items.values(), key=lambda s: s.name)]

    def missing(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` no secret has."""
        return [n for n in names if n not in self.mirror.items]

    async def put(self, name: str, values: dict[str, str], by: str) -> SecretView:
        check_name(name)
        fernet = self.fernet
        values = check_values(values)
        now = time.time()
        old = self.mirror.items.get(name)
        ciphertext = fernet.encrypt(encoder.encode(values)).decode()
        stored = StoredSecret(name=name, keys=sorted(values), ciphertext=ciphertext,
                              created_at=old.created_at if old else now, updated_at=now, updated_by=by)
        revision = await self._write(name, lambda: self._kv.put(name, encoder.encode(stored)))
        self.mirror.record(name, stored, revision)
        log.info("secret %s set by %s: keys %s", name, by or "-", ", ".join(stored.keys))
        return view(stored)

    async def delete(self, name: str, by: str) -> SecretView:
        stored = self.mirror.items.get(name)
        if stored is None:
            raise NotFoundError(f"no secret named {name[:80]!r} (`ember secret ls` lists them)")
        await self._write(name, lambda: self._kv.delete(name))
        self.mirror.items.pop(name, None)
        log.info("secret %s removed by %s", name, by or "-")
        return view(stored)

    def env(self, names: Iterable[str]) -> dict[str, str]:
        """The keys and values of the secrets ``names``, merged in order (a later one wins a shared key)."""
        env: dict[str, str] = {}
        for name in names:
            stored = self.mirror.items.get(name)
            if stored is None:
                raise NotFoundError(f"secret {name!r} does not exist (`ember secret set {name} KEY=VALUE`)")
            try:
                env.update(_values.decode(self.fernet.decrypt(stored.ciphertext.encode())))
            except (InvalidToken, msgspec.DecodeError):
                raise InvalidInputError(f"secret {name!r} cannot be decrypted with this control plane's key: it was "
                                        f"set under another one ({KEY_SETTING})", field="secrets") from None
        return env

    async def _write(self, name: str, write: Callable[[], Awaitable[object]]) -> int:
        try:
            result = await write()
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"secret {name} could not be stored ({type(exc).__name__}); the ember_secrets "
                                   "bucket may be full (EMBER_SECRETS_KV_MAX_BYTES)", retry_after_s=1.0) from exc
        return int(result) if isinstance(result, int) else 0


def view(stored: StoredSecret) -> SecretView:
    return SecretView(name=stored.name, keys=stored.keys, created_at=stored.created_at, updated_at=stored.updated_at)
