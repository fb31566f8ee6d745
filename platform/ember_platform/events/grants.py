"""The subject grants' store: records in the ``ember_subject_grants`` bucket, which only the control plane reads
and writes (no replica or node has a NATS permission on it), mirrored in memory by every control plane.

A grant changes what an app may bind at its next push; what is deployed keeps its subjects until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue

from ember._errors import InvalidInputError, NotFoundError, UnavailableError
from ember.wire import encoder
from ember.wire.grants import SubjectGrant, SubjectGrantRequest, grant_key
from ember.wire.jetstream import KVMirror
from ember.wire.validate import subject_problem
from ember_platform.auth.scopes import APP_PATTERN, MAX_PATTERNS

log = logging.getLogger("ember.subjects")
_decoder = msgspec.json.Decoder(SubjectGrant)
_WRITE_TRIES = 10  # compare-and-set rounds against other control planes' writes
Change = Callable[[SubjectGrant | None], SubjectGrant | None]  # the grant now -> the grant to keep (None: none)


def check_request(request: SubjectGrantRequest, *, apps_required: bool) -> None:
    """422 naming the field: a usable subject pattern (wildcards allowed, no reserved root) and app patterns."""
    problem = subject_problem(request.pattern, wildcards=True)
    if problem:
        raise InvalidInputError(problem, field="$.pattern")
    if (apps_required and not request.apps) or len(request.apps) > MAX_PATTERNS:
        raise InvalidInputError(f"apps: the app patterns to grant it to ('ingest-*', 1 to {MAX_PATTERNS})",
                                field="$.apps")
    for i, pattern in enumerate(request.apps):
        if not APP_PATTERN.fullmatch(pattern):
            raise InvalidInputError(f"app pattern {pattern[:80]!r}: 1 to 63 of lowercase letters, digits, '-' and the "
                                    "globs '*' and '?'", field=f"$.apps[{i}]")


class GrantStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.mirror: KVMirror[SubjectGrant] = KVMirror(kv, _decoder.decode, heal=encoder.encode)

    async def start(self) -> None:
        await self.mirror.start()

    async def stop(self) -> None:
        await self.mirror.stop()

    def all(self) -> list[SubjectGrant]:
        return sorted(self.mirror.items.values(), key=lambda g: g.pattern)

    async def grant(self, request: SubjectGrantRequest, by: str) -> SubjectGrant:
        """Add ``request.apps`` to the apps granted ``request.pattern``."""
        check_request(request, apps_required=True)

        def add(current: SubjectGrant | None) -> SubjectGrant:
            apps = list(dict.fromkeys([*(current.apps if current else []), *request.apps]))
            return SubjectGrant(pattern=request.pattern, apps=apps, updated_at=time.time(), updated_by=by)

        grant = await self._change(request.pattern, add)
        log.info("subject %s granted to %s by %s", request.pattern, ",".join(request.apps), by or "-")
        assert grant is not None
        return grant

    async def revoke(self, request: SubjectGrantRequest, by: str) -> SubjectGrant | None:
        """Remove ``request.apps`` (none: every app) from the grant of ``request.pattern``; what is left, or None
        once no app is left. 404 when the pattern was never granted."""
        check_request(request, apps_required=False)

        def remove(current: SubjectGrant | None) -> SubjectGrant | None:
            if current is None:
                raise NotFoundError(f"no grant of {request.pattern[:300]!r} (`ember subject ls` lists them)")
            apps = [a for a in current.apps if request.apps and a not in request.apps]
            return SubjectGrant(pattern=current.pattern, apps=apps, updated_at=time.time(),
                                updated_by=by) if apps else None

        grant = await self._change(request.pattern, remove)
        log.info("subject %s revoked from %s by %s", request.pattern, ",".join(request.apps) or "every app", by or "-")
        return grant

    async def _change(self, pattern: str, change: Change) -> SubjectGrant | None:
        key = grant_key(pattern)
        try:
            for _ in range(_WRITE_TRIES):
                try:
                    entry = await self._kv.get(key)
                    current, revision = _decoder.decode(entry.value or b""), entry.revision
                except JsNotFound:
                    current, revision = None, None
                grant = change(current)
                try:
                    written = await self._write(key, grant, revision)
                except KeyWrongLastSequenceError:
                    continue
                if grant is None:
                    self.mirror.items.pop(key, None)  # the watch delivers the deletion too, with its revision
                else:
                    self.mirror.record(key, grant, written)
                return grant
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"the grant of {pattern[:300]!r} could not be stored ({type(exc).__name__}); the "
                                   "ember_subject_grants bucket may be full (EMBER_SUBJECT_GRANTS_KV_MAX_BYTES)",
                                   retry_after_s=1.0) from exc
        raise UnavailableError(f"the grant of {pattern[:300]!r} was changed by others meanwhile; try again",
                               retry_after_s=1.0)

    async def _write(self, key: str, grant: SubjectGrant | None, revision: int | None) -> int:
        if grant is None:
            if revision is not None:
                await self._kv.delete(key, last=revision)
            return 0
        if revision is None:
            return int(await self._kv.create(key, encoder.encode(grant)))
        return int(await self._kv.update(key, encoder.encode(grant), last=revision))
