"""Outside producers and consumers of events: a plain NATS client (``nats pub``, nats-py, no Ember SDK) that
presents an Ember token with the ``events`` scope.

How such a client connects (the auth callout asks ``EventClients.admit``):

- the token as the NATS token: ``nats.connect(url, token=T, inbox_prefix="_INBOX.events_<token id>")``;
- or user ``token`` and the token as the password (``NATS_USER=token NATS_PASSWORD=$T nats pub ...``);
- or the token as the user name, with no password (what some clients send for ``--user T``).

What it may do, computed at connect from the deployments the callout mirrors (``permissions``): publish to the
subjects bound (``on=``) by the functions of the apps its token sees, subscribe to those functions' result subjects
and to its own inbox, ``_INBOX.events_<token id>.>`` (a JetStream publish's ack and an ``Ember-Reply-To`` result
arrive there): nothing else, no ``$JS.API``, no other app's subjects. An app deployed after it connected is in its
permissions from its next connect.

Revoking the token ends its connections: each control plane remembers the connections it admitted (server id and
client id from the server's request) and, every ``SWEEP_S``, asks the server to kick those whose token is revoked
(``$SYS.REQ.SERVER.<id>.KICK``, over a connection of its own in the system account); a reconnect is then refused.
Should that fail (a control plane gone, a server without a system account), the user JWT's ``exp`` bounds the
delay: at most ``CLIENT_TTL_S``, or the token's own expiry if sooner, after which the server disconnects the client
and its reconnect meets the callout again. The token is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError

from ember.wire import Deployment
from ember.wire.jetstream import KVMirror
from ember.wire.tokens import TOKEN_PREFIX
from ember.wire.validate import reserved_root
from ember_platform.auth.scopes import EVENTS, Principal
from ember_platform.auth.tokens import TokenRefused, TokenStore
from ember_platform.natsauth.keys import AuthKeys

log = logging.getLogger("ember.natsauth")
TOKEN_USER = "token"  # user ``token``, password: the Ember token
SYSTEM_USER = "system.ember"  # the control plane's own connection in the system account (it kicks, nothing else)
SYSTEM_ACCOUNT = "$SYS"
CLIENT_TTL_S = 3600.0  # an event client's user JWT expires after this at most: the bound should a kick fail
SWEEP_S = 1.0  # how often a control plane looks for the connections of revoked tokens
_KICK_TIMEOUT_S = 2.0
# Never, whatever a function binds: the server's and Ember's own subjects (validation refuses such ``on=`` already).
_DENIED = ["$JS.>", "$KV.>", "$O.>", "$SYS.>", "ember.>", "_EMBER.>"]
_LIMITS = {"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}


class Refused(Exception):
    """Why a client is refused (sent back to the server, which logs it; the client sees an authorization error)."""


def events_inbox(token_id: str) -> str:
    """The inbox prefix of an event client: the only inbox it may subscribe to."""
    return f"_INBOX.events_{token_id}"


def token_of(opts: dict[str, Any]) -> str | None:
    """The Ember token a client presented in its CONNECT options (``auth_token``, user ``token`` with the token as
    password, or the token as the user name), or None when it presented none."""
    user = str(opts.get("user") or "")
    if opts.get("auth_token"):
        return str(opts["auth_token"])
    if user == TOKEN_USER:
        return str(opts.get("pass") or "")
    if user.startswith(TOKEN_PREFIX):
        return user
    return None


def system_password(keys: AuthKeys) -> str:
    """The password of the control plane's system-account connection, derived from the callout's secret."""
    return hmac.new(bytes.fromhex(keys.secret), b"system", hashlib.sha256).hexdigest()


def is_system(keys: AuthKeys, user: str, password: str) -> bool:
    return user == SYSTEM_USER and hmac.compare_digest(password.encode(), system_password(keys).encode())


def system_permissions() -> dict[str, Any]:
    """The control plane's system-account connection: kick a client, read the answer; nothing else."""
    return {"pub": {"allow": ["$SYS.REQ.SERVER.*.KICK"]}, "sub": {"allow": ["_INBOX.>"]}, **_LIMITS}


def bound_functions(principal: Principal, deployments: Iterable[Deployment]) -> tuple[set[str], set[str]]:
    """The subjects bound (``on=``) by the functions of the apps ``principal`` sees, and their result subjects.
    A reserved subject is left out, whatever a deployment says."""
    bound: set[str] = set()
    results: set[str] = set()
    for dep in deployments:
        if not principal.sees(dep.app):
            continue
        for service in dep.manifest.services:
            for fn in service.functions:
                bound |= {s for s in fn.on if _usable(s)}
                if fn.on and fn.result_subject and _usable(fn.result_subject):
                    results.add(fn.result_subject)
    return bound, results


def _usable(subject: str) -> bool:
    first = subject.split(".", 1)[0]
    return bool(subject) and not reserved_root(first) and first not in ("*", ">")


def permissions(token_id: str, principal: Principal, deployments: Iterable[Deployment]) -> dict[str, Any]:
    """An event client's ``nats`` claims: publish to its apps' bound subjects, subscribe to their result subjects
    and its own inbox."""
    bound, results = bound_functions(principal, deployments)
    sub = sorted(results | {f"{events_inbox(token_id)}.>"})
    return {"pub": {"allow": sorted(bound), "deny": _DENIED}, "sub": {"allow": sub, "deny": _DENIED}, **_LIMITS}


def matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``subject`` (no wildcards) is matched by ``pattern`` (``*`` one token, a final ``>``
    one or more)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


@dataclass(frozen=True)
class Admission:
    """What the callout answers for an admitted client: its name, account, permissions and expiry."""

    name: str
    nats: dict[str, Any]
    account: str = "$G"
    expires: float | None = None


@dataclass
class _Conn:
    token_id: str
    server_id: str
    cid: int
    until: float  # its JWT's expiry: the server has cut it by then
    tries: int = field(default=0)


class EventClients:
    """Admits event clients and cuts the connections of revoked tokens (``SWEEP_S``)."""

    def __init__(self, keys: AuthKeys, tokens: TokenStore | None, deployments: KVMirror[Deployment],
                 servers: list[str] | None = None) -> None:
        self._keys = keys
        self._tokens = tokens
        self._deployments = deployments
        self._servers = servers or []
        self._conns: dict[tuple[str, int], _Conn] = {}
        self._system: Client | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sweep_every(), name="event-clients-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._system is not None:
            with contextlib.suppress(Exception):
                await self._system.close()

    def admit(self, token: str, server_id: str, cid: int | None) -> Admission:
        """The admission of a client presenting ``token``, or ``Refused``: an unknown, revoked or expired token, one
        without the ``events`` scope, or a control plane that checks no tokens."""
        if self._tokens is None or not self._tokens.enabled:
            raise Refused("this control plane checks no tokens: event clients are refused")
        try:
            principal = self._tokens.authenticate(f"Bearer {token}")
        except TokenRefused:
            raise Refused("unknown, revoked or expired token") from None
        if not principal.may(EVENTS):
            raise Refused(f"token {principal.token_id} lacks the events scope")
        token_id = principal.token_id
        stored = self._tokens.mirror.items.get(token_id)
        token_expiry = stored.info.expires_at if stored is not None and stored.info.expires_at else math.inf
        expires = min(token_expiry, time.time() + CLIENT_TTL_S)
        if cid is not None:
            self._conns[(server_id, cid)] = _Conn(token_id, server_id, cid, expires)
        perms = permissions(token_id, principal, self._deployments.items.values())
        return Admission(name=f"events.{token_id}", nats=perms, expires=expires)

    def tracked(self) -> int:
        return len(self._conns)

    async def sweep(self, now: float | None = None) -> int:
        """Kick the connections whose token is revoked (forget those past their expiry); how many were kicked."""
        now = time.time() if now is None else now
        kicked = 0
        for key, conn in list(self._conns.items()):
            if conn.until <= now:
                self._conns.pop(key, None)
            elif not self._live(conn.token_id, now) and await self._kick(conn):
                self._conns.pop(key, None)
                kicked += 1
        return kicked

    def _live(self, token_id: str, now: float) -> bool:
        stored = self._tokens.mirror.items.get(token_id) if self._tokens is not None else None
        return stored is not None and stored.revoked_at is None \
            and (stored.info.expires_at is None or stored.info.expires_at > now)

    async def _kick(self, conn: _Conn) -> bool:
        """Ask the client's server to close it; True once the server answered (closed, or already gone)."""
        try:
            system = await self._system_connection()
            answer = await system.request(f"$SYS.REQ.SERVER.{conn.server_id}.KICK",
                                          json.dumps({"cid": conn.cid}).encode(), timeout=_KICK_TIMEOUT_S)
        except (NatsError, OSError, TimeoutError) as exc:
            conn.tries += 1
            if conn.tries in (1, 60):
                log.warning("could not cut a connection of revoked token %s (%s); the server cuts it by %s at the "
                            "latest", conn.token_id, type(exc).__name__,
                            time.strftime("%H:%M:%S UTC", time.gmtime(conn.until)))
            return False
        try:
            error = json.loads(answer.data).get("error")
        except (ValueError, AttributeError):
            error = None
        log.info("cut connection %d of revoked token %s%s", conn.cid, conn.token_id,
                 f" (the server says: {error})" if error else "")
        return True

    async def _system_connection(self) -> Client:
        if self._system is None or self._system.is_closed:
            self._system = await nats.connect(self._servers, user=SYSTEM_USER, password=system_password(self._keys),
                                              name="ember-platform-system", allow_reconnect=True,
                                              max_reconnect_attempts=-1, connect_timeout=2)
        return self._system

    async def _sweep_every(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweeping the connections of revoked tokens failed; trying again")
