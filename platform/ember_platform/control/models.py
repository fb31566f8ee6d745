"""Served model names (``openai=``), unique across the platform, claimed atomically.

A name is a key of the ``ember_models`` bucket (``subjects.model_key``: the validated name, hex-encoded) whose value
names the app that claimed it. A claim is a KV ``create``, which fails when the key exists: of two pushes naming one
model at once, through one control plane or two, exactly one gets it; the other is a 409 naming the field. The app
keeps its names across its versions, and they are released when no version of it that runs names them any more
(a new version that drops one, once it takes the traffic) and when it is deleted. A claim left behind by a control
plane that died between claiming and recording a deployment is taken over once ``STALE_S`` old, and only if its app
serves no such model. The bucket is the control plane's alone: no replica's or node's permissions name it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import msgspec
from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue

from ember._errors import ConflictError
from ember.wire import Deployment, Manifest, deployment_decoder, subjects
from ember.wire.jetstream import StorageLimits, create_limited_kv, js_replicas

log = logging.getLogger("ember.models")
STALE_S = 120.0  # a claim older than this whose app serves no such model was left behind: it may be taken over
_TRIES = 8


class ModelClaim(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a model's key: the app that holds the name, and since when."""

    model: str
    app: str
    claimed_at: float


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ModelClaim)


def named(manifest: Manifest, field: str | None = None) -> dict[str, str]:
    """The model names ``manifest`` serves, each with the field that names it (``field`` for all, if given)."""
    return {fn.openai: field or f"$.manifest.services[{i}].functions[{j}].openai"
            for i, svc in enumerate(manifest.services) for j, fn in enumerate(svc.functions) if fn.openai}


def served(dep: Deployment | None) -> dict[str, str]:
    """The model names that the running versions of ``dep`` serve, each with the field that names it (in the
    deployment's own manifest where it names it, else its version)."""
    if dep is None:
        return {}
    names = named(dep.manifest)
    for version in sorted(dep.running() - {dep.version}):
        held = dep.at(version)
        if held is not None:
            names = {**named(held.manifest, "$.version"), **names}
    return names


class ModelClaims:
    """The ``ember_models`` bucket: which app holds each served model name."""

    def __init__(self, kv: KeyValue, deployments: KeyValue) -> None:
        self._kv = kv
        self._deployments = deployments

    @classmethod
    async def open(cls, js: JetStreamContext, deployments: KeyValue) -> ModelClaims:
        """Open the bucket, creating it the first time."""
        try:
            kv = await js.key_value(subjects.MODELS_BUCKET)
        except (BucketNotFoundError, JsNotFound):
            kv = await create_limited_kv(js, subjects.MODELS_BUCKET, StorageLimits.from_env().owners_kv_max_bytes,
                                         history=1, max_value_size=4096, storage=StorageType.FILE,
                                         replicas=js_replicas())
        return cls(kv, deployments)

    async def owner(self, model: str) -> str | None:
        """The app that holds ``model``, or None."""
        held = await self._read(model)
        return held[0].app if held else None

    async def claim(self, app: str, names: dict[str, str]) -> set[str]:
        """Claim every name of ``names`` (name -> the field that asks for it) for ``app``; the names newly claimed.
        ``ConflictError`` naming the field when another app holds one (those claimed by this call are released)."""
        new: set[str] = set()
        try:
            for name in sorted(names):
                if await self._claim_one(app, name, names[name]):
                    new.add(name)
        except BaseException:
            await self.release(app, new)
            raise
        return new

    async def release(self, app: str, names: Iterable[str]) -> None:
        """Give up those of ``names`` that ``app`` holds (a compare-and-set delete: never another app's claim)."""
        for name in names:
            held = await self._read(name)
            if held is None or held[0].app != app:
                continue
            try:
                await self._kv.delete(subjects.model_key(name), last=held[1])
            except KeyWrongLastSequenceError:  # claimed anew meanwhile: it is no longer this claim
                continue

    async def release_after(self, app: str, names: Iterable[str]) -> None:
        """:meth:`release` once what they were held for is written: a failure is logged, not raised (the claims
        left behind are taken over after ``STALE_S``, their app serving no such model)."""
        try:
            await self.release(app, names)
        except Exception:
            log.exception("app %s: could not release the model names %s", app, sorted(names))

    async def _claim_one(self, app: str, name: str, field: str) -> bool:
        key = subjects.model_key(name)
        value = _encoder.encode(ModelClaim(model=name, app=app, claimed_at=time.time()))
        for _ in range(_TRIES):
            try:
                await self._kv.create(key, value)
                return True
            except KeyWrongLastSequenceError:
                pass
            held = await self._read(name)
            if held is None:  # released meanwhile: create again
                continue
            claim, revision = held
            if claim.app == app:
                return False
            if not await self._left_behind(claim):
                raise ConflictError(f"the model name {name!r} is taken by another app; choose another openai= name",
                                    field=field)
            try:
                await self._kv.update(key, value, last=revision)
                log.warning("model %r: took over the claim app %r left behind", name, claim.app)
                return True
            except KeyWrongLastSequenceError:
                continue
        raise ConflictError(f"too many claims of the model name {name!r} at once: try again", field=field)

    async def _left_behind(self, claim: ModelClaim) -> bool:
        """Whether ``claim`` is old and its app serves no such model (a push that claimed it and never recorded)."""
        if time.time() - claim.claimed_at < STALE_S:
            return False
        try:
            entry = await self._deployments.get(claim.app)
            dep = deployment_decoder.decode(entry.value) if entry.value else None
        except (KeyNotFoundError, JsNotFound):
            dep = None
        return claim.model not in served(dep)

    async def _read(self, name: str) -> tuple[ModelClaim, int] | None:
        try:
            entry = await self._kv.get(subjects.model_key(name))
        except (KeyNotFoundError, JsNotFound):
            return None
        if not entry.value or entry.revision is None:
            return None
        return _decoder.decode(entry.value), entry.revision
