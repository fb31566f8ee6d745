"""The token store: records in the ``ember_tokens`` bucket, mirrored in memory, so that checking a request's token is
a dict lookup and one sha256, without a NATS round trip.

Each control plane keeps its own mirror through the bucket's watch. A token created or revoked here is in this
mirror at once (read-your-writes); other control planes see it within a watch delivery. A revoked token's record
stays, marked ``revoked_at``, so that an id is never issued twice and the first start's token is printed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from ember._errors import NotFoundError, UnauthenticatedError, UnavailableError
from ember.wire import encoder
from ember.wire.jetstream import KVMirror
from ember.wire.kvmirror import server_answer
from ember.wire.tokens import NewToken, StoredToken, TokenInfo, TokenRequest, new_token, parse_token, secret_digest
from ember_platform.auth.scopes import EVERYONE, Principal, check_request

log = logging.getLogger("ember.auth")
_decoder = msgspec.json.Decoder(StoredToken)
FIRST_ADMIN_ID = "admin"  # the id of the token a control plane prints at the first start of an installation
_HINT = "send Authorization: Bearer <token> (set EMBER_TOKEN, or run `ember login`)"
KEEP_DEAD_S = 30 * 86400.0  # a revoked or expired token's record is kept this long (its id stays taken), then purged
COLLECT_EVERY_S = 3600.0


class TokenRefused(UnauthenticatedError):
    """A 401; ``challenge`` is its ``WWW-Authenticate`` header (RFC 6750): ``error="invalid_token"`` when a token
    was sent."""

    def __init__(self, message: str, *, given: bool) -> None:
        super().__init__(message, field="Authorization")
        self.challenge = 'Bearer error="invalid_token"' if given else "Bearer"


class TokenStore:
    """Issues, lists, revokes and checks tokens. With ``enabled`` False every request is let through as
    ``EVERYONE`` (``--insecure-no-auth``, on a loopback address only)."""

    def __init__(self, kv: KeyValue, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._kv = kv
        self.mirror: KVMirror[StoredToken] = KVMirror(kv, _decoder.decode, heal=encoder.encode)
        self._principals: dict[str, tuple[StoredToken, Principal]] = {}
        self._collector: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.mirror.start()
        self._collector = asyncio.create_task(self._collect_every(COLLECT_EVERY_S), name="token-collector")

    async def stop(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
        await self.mirror.stop()

    # -- the check on every request -------------------------------------------------------------------------------

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header's value; ``TokenRefused`` (401) for a missing, malformed,
        unknown, revoked or expired token. The secret's hash is compared in constant time."""
        if not self.enabled:
            return EVERYONE
        if authorization is None:
            raise TokenRefused(f"missing Authorization header: {_HINT}", given=False)
        scheme, _, token = authorization.partition(" ")
        parsed = parse_token(token.strip()) if scheme.lower() == "bearer" else None
        if parsed is None:
            raise TokenRefused(f"malformed Authorization header: {_HINT} (a token reads ember_<id>_<secret>)",
                               given=True)
        token_id, secret = parsed
        stored = self.mirror.items.get(token_id)
        if stored is None or stored.revoked_at is not None \
                or not hmac.compare_digest(stored.secret_sha256, secret_digest(secret)):
            raise TokenRefused("unknown or revoked token", given=True)
        expires_at = stored.info.expires_at
        if expires_at is not None and expires_at <= time.time():
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires_at))
            raise TokenRefused(f"token {token_id} expired at {when}", given=True)
        kept = self._principals.get(token_id)
        if kept is None or kept[0] is not stored:
            kept = self._principals[token_id] = (stored, Principal.of(stored.info))
        return kept[1]

    # -- the admin routes ---------------------------------------------------------------------------------------

    def live(self) -> list[TokenInfo]:
        """Every live token's record (no secrets), oldest first."""
        now = time.time()
        live = [s.info for s in self.mirror.items.values()
                if s.revoked_at is None and (s.info.expires_at is None or s.info.expires_at > now)]
        return sorted(live, key=lambda info: (info.created_at, info.id))

    def info(self, token_id: str) -> TokenInfo:
        stored = self.mirror.items.get(token_id)
        if stored is None or stored.revoked_at is not None:
            raise NotFoundError(f"no token {token_id[:40]!r} (unknown or revoked)")
        return stored.info

    async def create(self, request: TokenRequest, by: Principal) -> NewToken:
        """A new token for ``request`` (checked: 422 naming the field), created by ``by``."""
        scopes, apps, ttl = check_request(request)
        now = time.time()
        while True:
            token = new_token()
            token_id, secret = parse_token(token) or ("", "")
            info = TokenInfo(id=token_id, name=request.name, scopes=scopes, apps=apps, created_at=now,
                             expires_at=now + ttl if math.isfinite(ttl) else None, created_by=by.token_id)
            if await self._create(StoredToken(info=info, secret_sha256=secret_digest(secret))):
                log.info("token %s created by %s: scopes %s, apps %s", token_id, by.token_id or "-", scopes, apps)
                return NewToken(token=token, info=info)

    async def revoke(self, token_id: str, by: Principal) -> TokenInfo:
        """Mark the token revoked: it fails at its next request here, and on other control planes once their
        watch delivers the change."""
        stored = self.mirror.items.get(token_id)
        if stored is None or stored.revoked_at is not None:
            raise NotFoundError(f"no token {token_id[:40]!r} (unknown or revoked already)")
        revoked = msgspec.structs.replace(stored, revoked_at=time.time())
        try:
            revision = await self._kv.put(token_id, encoder.encode(revoked))
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"token {token_id} could not be revoked ({type(exc).__name__}: {exc}); retry",
                                   retry_after_s=1.0) from exc
        self.mirror.record(token_id, revoked, revision)
        log.info("token %s revoked by %s", token_id, by.token_id or "-")
        return stored.info

    # -- bootstrap ----------------------------------------------------------------------------------------------

    async def ensure_admin(self, token: str, name: str) -> None:
        """Make sure the admin token ``token`` (from a bootstrap file) has its record: idempotent across restarts
        and across control planes. A record of its id with another secret is refused (``ValueError``); a record
        revoked stays revoked."""
        token_id, secret = parse_token(token) or ("", "")
        digest = secret_digest(secret)
        info = TokenInfo(id=token_id, name=name, scopes=["admin"], apps=["*"], created_at=time.time())
        record = StoredToken(info=info, secret_sha256=digest, bootstrap=True)
        if await self._create(record):
            log.info("bootstrap token %s recorded", token_id)
            return
        existing = None
        for _ in range(3):  # a spoiled record written over, or back by a running control plane meanwhile: again
            with contextlib.suppress(msgspec.DecodeError):
                existing = await self._read(token_id)
            if existing is not None:
                break
            if await self._write_over_spoiled(record):
                return
        if existing is None or not hmac.compare_digest(existing.secret_sha256, digest):
            raise ValueError(f"the bootstrap token's id {token_id} belongs to another token: write a new one")
        if not existing.bootstrap:  # recorded before records said so: marked, so that the collector keeps it
            await self._mark_bootstrap(token_id)
        if existing.revoked_at is not None:
            log.warning("the bootstrap token %s was revoked; it stays revoked (write a new token to the file)",
                        token_id)

    async def _write_over_spoiled(self, record: StoredToken) -> bool:
        """Over a server's answer stored under the bootstrap token's key (see ``KVMirror``; no control plane ran to
        write the record back), the file's record, revoked: whether it was revoked is lost, and a revoked token must
        not come back (its holder may be who spoiled it). The control plane starts; the operator writes a new token
        to the file. False when the key holds anything else (a record of another shape stops the start, as before)."""
        try:
            entry = await self._kv.get(record.info.id)
        except (KeyNotFoundError, KeyDeletedError):
            return False
        if not server_answer(entry.value):
            return False
        revoked = msgspec.structs.replace(record, revoked_at=time.time())
        try:
            revision = await self._kv.update(record.info.id, encoder.encode(revoked), last=entry.revision)
        except KeyWrongLastSequenceError:  # written back meanwhile by a running control plane: read again
            return False
        self.mirror.record(record.info.id, revoked, revision)
        log.warning("the record of bootstrap token %s was a server's answer, stored there through a reply subject "
                    "while no control plane ran; it is written again REVOKED: write a new token to the bootstrap "
                    "file", record.info.id)
        return True

    async def _mark_bootstrap(self, token_id: str) -> None:
        """Mark the record as a bootstrap file's, as it stands (a revocation meanwhile wins: read again)."""
        for _ in range(10):
            entry = await self._kv.get(token_id)
            if not entry.value:
                return
            marked = msgspec.structs.replace(_decoder.decode(entry.value), bootstrap=True)
            with contextlib.suppress(KeyWrongLastSequenceError):
                await self._kv.update(token_id, encoder.encode(marked), last=entry.revision)
                return

    async def first_admin(self) -> str | None:
        """An admin token for an installation that has never had one (an empty bucket), or None. Several control
        planes starting at once create it once: the token's id is fixed, and only the first ``create`` wins."""
        if self.mirror.items:
            return None
        token = new_token(FIRST_ADMIN_ID)
        _, secret = parse_token(token) or ("", "")
        info = TokenInfo(id=FIRST_ADMIN_ID, name="first admin", scopes=["admin"], apps=["*"], created_at=time.time())
        return token if await self._create(StoredToken(info=info, secret_sha256=secret_digest(secret))) else None

    # -- the collector ------------------------------------------------------------------------------------------

    async def collect(self, now: float | None = None) -> list[str]:
        """Purge the records of tokens revoked or expired more than ``KEEP_DEAD_S`` ago (the first admin token's
        record stays: it is printed once per installation; a bootstrap file's too: the file may be given again);
        the ids purged. Every control plane may run it."""
        limit = (now if now is not None else time.time()) - KEEP_DEAD_S
        dead = [token_id for token_id, s in list(self.mirror.items.items())
                if token_id != FIRST_ADMIN_ID and not s.bootstrap
                and min(s.revoked_at or math.inf, s.info.expires_at or math.inf) < limit]
        for token_id in dead:
            await self._kv.purge(token_id)
        if dead:
            log.info("purged the records of %d tokens revoked or expired %d days ago", len(dead), KEEP_DEAD_S // 86400)
        return dead

    async def _collect_every(self, period_s: float) -> None:
        while True:
            try:
                await self.collect()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("collecting dead tokens failed; trying again in %.0f s", period_s)
            await asyncio.sleep(period_s)

    async def _create(self, stored: StoredToken) -> bool:
        """Store a new record; False when its id is taken. ``UnavailableError`` (503) when the bucket refuses it
        (full: EMBER_TOKENS_KV_MAX_BYTES)."""
        try:
            revision = await self._kv.create(stored.info.id, encoder.encode(stored))
        except KeyWrongLastSequenceError:
            return False
        except (NatsError, OSError, TimeoutError) as exc:
            raise UnavailableError(f"the token could not be stored ({type(exc).__name__}: {exc}); the ember_tokens "
                                   "bucket may be full (EMBER_TOKENS_KV_MAX_BYTES): revoke tokens, or raise it",
                                   retry_after_s=5.0) from exc
        self.mirror.record(stored.info.id, stored, revision)
        return True

    async def _read(self, token_id: str) -> StoredToken | None:
        try:
            entry = await self._kv.get(token_id)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return _decoder.decode(entry.value) if entry.value else None
