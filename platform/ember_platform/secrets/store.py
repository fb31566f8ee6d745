"""The secret store: records in the ``ember_secrets`` bucket, their values a Fernet token under the control
plane's key, mirrored in memory (still encrypted) by every control plane. Values are decrypted only to answer a
node agent (``server``), and are never logged. Each record names the app patterns that may use it, checked at a
push (``check_declared``, from the mirror) and again, read fresh, when a node asks (``env_for``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import msgspec
from cryptography.fernet import Fernet, InvalidToken
from nats.errors import Error as NatsError
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from ember._errors import InvalidInputError, NotFoundError, UnavailableError
from ember.wire import Manifest, encoder
from ember.wire.jetstream import KVMirror
from ember.wire.secrets import SecretView, StoredSecret, name_problem
from ember_platform.secrets.checks import check_apps, check_name, check_values, refusal, serves
from ember_platform.secrets.key import KEY_SETTING

log = logging.getLogger("ember.secrets")
_decoder = msgspec.json.Decoder(StoredSecret)
_values = msgspec.json.Decoder(dict[str, str])


class SecretStore:
    def __init__(self, kv: KeyValue, fernet: Fernet | None) -> None:
        self._kv = kv
        self._fernet = fernet
        self.mirror: KVMirror[StoredSecret] = KVMirror(kv, _decoder.decode, heal=encoder.encode)

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

    def unusable(self, app: str, names: Iterable[str]) -> list[str]:
        """Which of ``names`` ``app`` may not use: no such secret, or none of its patterns matches the app."""
        return [n for n in names if not serves(self.mirror.items.get(n), app)]

    def check_declared(self, app: str, manifest: Manifest, admin: bool = False) -> None:
        """Every secret a service of ``app`` names exists and is for this app: else a 422 naming the field, in the
        words of a secret that does not exist (an admin, who may list every secret, is told the real reason).
        Values are not read here."""
        for i, service in enumerate(manifest.services):
            for j, name in enumerate(service.secrets):
                if name_problem(name) is None and self.unusable(app, [name]):
                    shown = self.mirror.items.get(name) if admin else None
                    raise InvalidInputError(refusal(name, app, shown), field=f"$.manifest.services[{i}].secrets[{j}]")

    async def put(self, name: str, values: dict[str, str], apps: list[str] | None, by: str) -> SecretView:
        check_name(name)
        fernet = self.fernet
        values = check_values(values)
        apps = check_apps(apps)
        now = time.time()
        old = self.mirror.items.get(name)
        ciphertext = fernet.encrypt(encoder.encode(values)).decode()
        stored = StoredSecret(name=name, keys=sorted(values), ciphertext=ciphertext, apps=apps,
                              created_at=old.created_at if old else now, updated_at=now, updated_by=by)
        revision = await self._write(name, lambda: self._kv.put(name, encoder.encode(stored)))
        self.mirror.record(name, stored, revision)
        log.info("secret %s set by %s: keys %s, for apps %s", name, by or "-", ", ".join(stored.keys),
                 ", ".join(apps))
        return view(stored)

    async def delete(self, name: str, by: str) -> SecretView:
        stored = self.mirror.items.get(name)
        if stored is None:
            raise NotFoundError(f"no secret named {name[:80]!r} (`ember secret ls` lists them)")
        await self._write(name, lambda: self._kv.delete(name))
        self.mirror.items.pop(name, None)
        log.info("secret %s removed by %s", name, by or "-")
        return view(stored)

    async def env_for(self, app: str, names: Sequence[str]) -> dict[str, str]:
        """The keys and values of the secrets ``names`` for a replica of ``app``, each read fresh from the bucket
        (a secret narrowed or removed a moment ago, on any control plane, is refused now) and checked against its
        patterns; ``NotFoundError`` in the words of a missing secret for one the app may not use."""
        records = [await self._fresh(name) for name in names]
        for name, stored in zip(names, records, strict=True):
            if stored is None or not serves(stored, app):
                raise NotFoundError(refusal(name, app))
        return self.decrypt([r for r in records if r is not None])

    def decrypt(self, records: Iterable[StoredSecret]) -> dict[str, str]:
        """The keys and values of ``records``, merged in order (a later one wins a shared key)."""
        env: dict[str, str] = {}
        for stored in records:
            try:
                env.update(_values.decode(self.fernet.decrypt(stored.ciphertext.encode())))
            except (InvalidToken, msgspec.DecodeError):
                raise InvalidInputError(f"secret {stored.name!r} cannot be decrypted with this control plane's key: "
                                        f"it was set under another one ({KEY_SETTING})", field="secrets") from None
        return env

    async def _fresh(self, name: str) -> StoredSecret | None:
        """The record of ``name`` as the bucket holds it now (this control plane's mirror may lag), or None."""
        try:
            entry = await self._kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"secret {name} could not be read ({type(exc).__name__})",
                                   retry_after_s=1.0) from exc
        return _decoder.decode(entry.value) if entry.value else None

    async def _write(self, name: str, write: Callable[[], Awaitable[object]]) -> int:
        try:
            result = await write()
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"secret {name} could not be stored ({type(exc).__name__}); the ember_secrets "
                                   "bucket may be full (EMBER_SECRETS_KV_MAX_BYTES)", retry_after_s=1.0) from exc
        return int(result) if isinstance(result, int) else 0


def view(stored: StoredSecret) -> SecretView:
    return SecretView(name=stored.name, keys=stored.keys, created_at=stored.created_at, updated_at=stored.updated_at,
                      apps=stored.apps)
