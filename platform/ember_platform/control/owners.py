"""Who may name stored content: the app patterns of every token that uploaded it.

Bundles and volume chunks are stored once under their sha256, whoever uploads them (deduplication). A hash is
never proof of ownership: a deployment or a volume version may name content only where one of the patterns
recorded for it covers the app or volume it is for (an admin's upload records the app or volume it says it is for;
``'*'``, recorded for one that says none, covers every name).
A second tenant uploading the same bytes adds its patterns to the record; the bytes are not stored again.

The record is a key of the ``ember_owners`` bucket, ``<kind>.<sha256>`` -> a JSON list of patterns, read and
written by the control plane alone (no other component is granted the bucket), updated with compare-and-set so
that two uploads at once both count. It is deleted with the content it describes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Literal

from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue

from ember._errors import ConflictError, ForbiddenError, InvalidInputError
from ember.wire import subjects
from ember.wire.jetstream import StorageLimits, create_limited_kv, js_replicas
from ember_platform.auth.scopes import Principal

Kind = Literal["bundle", "chunk", "image"]
MAX_PATTERNS = 512  # one record's patterns: tenants sharing the same bytes
_LOOKUPS = 32  # records read at once


def patterns_of(principal: Principal, target: str | None = None) -> list[str]:
    """The patterns an upload by ``principal`` records: its token's app patterns; for an admin or a ``'*'`` token, the
    app or volume the upload says it is for (``target``), else ``['*']`` (a client that names none). Recorded as
    ``'*'``, an admin's upload for one app was deployable by any tenant that knew its hash."""
    if principal.all_apps:
        return [target] if target else ["*"]
    return sorted(principal.exact | set(principal.globs))


def upload_target(principal: Principal, name: str | None, problem: str | None, field: str) -> str | None:
    """The app or volume an upload says it is for (``?app=``, ``?volume=``), once well formed (``problem``: what is
    wrong with it, if anything) and seen by the token: 422 or 403 otherwise."""
    if name is None:
        return None
    if problem:
        raise InvalidInputError(problem, field=field)
    if not principal.sees(name):
        raise ForbiddenError(f"this token's app patterns do not cover {name!r}", field=field)
    return name


def covers(patterns: Iterable[str], name: str) -> bool:
    """Whether one of ``patterns`` matches the app or volume ``name``."""
    return any(p == "*" or fnmatchcase(name, p) for p in patterns)


def _includes(wide: str, narrow: str) -> bool:
    """Whether every name ``narrow`` matches, ``wide`` matches too (sure when True; False when unsure)."""
    if wide in ("*", narrow):
        return True
    if not any(c in narrow for c in "*?"):
        return fnmatchcase(narrow, wide)
    head = wide[:-1]
    return wide.endswith("*") and not any(c in head for c in "*?") and narrow.startswith(head)


def covers_token(patterns: Iterable[str], principal: Principal) -> bool:
    """Whether ``patterns`` cover every name ``principal`` sees, so that it may name the content for any of them
    (the question of "which chunks are missing", asked without a volume's name)."""
    recorded = list(patterns)
    if principal.all_apps:
        return True
    return all(any(_includes(p, mine) for p in recorded) for mine in (*principal.exact, *principal.globs))


class Owners:
    """The ``ember_owners`` bucket: the patterns recorded for each stored object."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> Owners:
        """Open the bucket, creating it the first time."""
        try:
            kv = await js.key_value(subjects.OWNERS_BUCKET)
        except (BucketNotFoundError, JsNotFound):
            kv = await create_limited_kv(js, subjects.OWNERS_BUCKET, StorageLimits.from_env().owners_kv_max_bytes,
                                         max_value_size=64 * 1024, storage=StorageType.FILE, replicas=js_replicas())
        return cls(kv)

    async def patterns(self, kind: Kind, sha: str) -> list[str]:
        """The patterns recorded for ``sha``: none for content nobody uploaded through the API."""
        return (await self._read(kind, sha))[0]

    async def _read(self, kind: Kind, sha: str) -> tuple[list[str], int | None]:
        try:
            entry = await self._kv.get(f"{kind}.{sha}")
        except (KeyNotFoundError, JsNotFound):
            return [], None
        if entry.value is None:
            return [], entry.revision
        return list(json.loads(entry.value)), entry.revision

    async def add(self, kind: Kind, sha: str, patterns: list[str]) -> bool:
        """Record ``patterns`` for ``sha`` besides those recorded; True when one of them is new (the upload
        is news to this token, whether or not the bytes were stored already)."""
        for _ in range(20):
            known, revision = await self._read(kind, sha)
            merged = _merged(known, patterns)
            if merged == sorted(known):
                return False
            if len(merged) > MAX_PATTERNS:
                raise ConflictError(f"this content is recorded for {len(known)} app patterns already, the most "
                                    "one object keeps: upload other bytes (a changed file)", field="$body")
            value = json.dumps(merged).encode()
            try:
                if revision is None:
                    await self._kv.create(f"{kind}.{sha}", value)
                else:
                    await self._kv.update(f"{kind}.{sha}", value, last=revision)
                return True
            except KeyWrongLastSequenceError:  # another upload recorded at the same time: read it, merge again
                continue
        raise ConflictError("too many uploads of this content at once: try again", field="$body")

    async def forget(self, kind: Kind, sha: str) -> None:
        """Delete the record of content that is deleted."""
        await self._kv.purge(f"{kind}.{sha}")

    async def covering(self, kind: Kind, shas: Iterable[str], name: str) -> set[str]:
        """Those of ``shas`` that may be named for the app or volume ``name``."""
        found = await self._many(kind, shas)
        return {sha for sha, patterns in found.items() if covers(patterns, name)}

    async def covering_token(self, kind: Kind, shas: Iterable[str], principal: Principal) -> set[str]:
        """Those of ``shas`` that ``principal`` may name for any app or volume it sees."""
        if principal.all_apps:
            return set(shas)
        found = await self._many(kind, shas)
        return {sha for sha, patterns in found.items() if covers_token(patterns, principal)}

    async def _many(self, kind: Kind, shas: Iterable[str]) -> dict[str, list[str]]:
        gate = asyncio.Semaphore(_LOOKUPS)

        async def one(sha: str) -> list[str]:
            async with gate:
                return await self.patterns(kind, sha)

        unique = list(dict.fromkeys(shas))
        return dict(zip(unique, await asyncio.gather(*(one(s) for s in unique)), strict=True))


def _merged(known: list[str], added: list[str]) -> list[str]:
    """The union, ``['*']`` once it holds ``'*'`` (which covers the rest)."""
    union = set(known) | set(added)
    return ["*"] if "*" in union else sorted(union)
