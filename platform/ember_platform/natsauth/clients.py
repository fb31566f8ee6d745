"""Outside producers and consumers of events: a plain NATS client (``nats pub``, nats-py, no Ember SDK) that
presents an Ember token with the ``events`` scope.

How such a client connects (the auth callout asks ``EventClients.admit``):

- the token as the NATS token: ``nats.connect(url, token=T, inbox_prefix="_INBOX.events_<token id>")``;
- or user ``token`` and the token as the password (``NATS_USER=token NATS_PASSWORD=$T nats pub ...``);
- or the token as the user name, with no password (what some clients send for ``--user T``).

What it may do, computed at connect from the deployments the callout mirrors (``permissions``): publish to the
subjects bound (``on=``) by the functions of the apps its token sees; subscribe to those functions' result subjects,
to those apps' replies to requesters (``_EMBER.replies.<app>.>``, for an ``Ember-Reply-To``) and to its own inbox,
``_INBOX.events_<token id>.>`` (a JetStream publish's ack arrives there). Nothing else: no ``$JS.API``, no other
app's subjects. An app deployed after it connected is in its permissions from its next connect.

Revoking the token ends its connections: every control plane, every ``SWEEP_S``, looks for tokens revoked since
(its mirror of the tokens), finds their connections on every server (``$SYS.REQ.SERVER.PING.CONNZ`` by user name,
``events.<token id>``) and kicks each (``$SYS.REQ.SERVER.<id>.KICK``), over a connection of its own in the system
account (``Kicker``, which also cuts unassigned replicas: ``natsauth.replicas``); the client's reconnect is then
refused. The delay is a sweep and the watch's delivery: about a second. An
expiring token's JWT expires with it (``exp``): the server cuts the client then. No other expiry: nats-py closes a
client for good when its credentials expire, so a shorter ``exp`` would end a healthy consumer's connection.
The token is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError

from ember._loop import cancel_and_wait
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
SWEEP_S = 1.0  # how often a control plane looks for tokens revoked since
RESWEEP_AT_START_S = 600.0  # a control plane starting cuts again the tokens revoked this lately
_KICK_TIMEOUT_S = 2.0
CONNZ_PAGE = 1024  # connections one server lists per CONNZ request
MAX_CONNZ_PAGES = 64  # a kick's pages, then it fails (its sweep tries again)
_QUIET_S = 0.25  # the servers' answers to a PING come together: once none came for this long, all have
# Never, whatever a function binds: the server's and Ember's own subjects (validation refuses such ``on=`` already).
_DENIED = ["$JS.>", "$KV.>", "$O.>", "$SYS.>", "ember.>", "_EMBER.>"]
_DENIED_SUB = [*_DENIED[:-1], "_EMBER.answers.>"]  # it may read its apps' event replies, under _EMBER.replies
EVENT_REPLIES_ROOT = "_EMBER.replies"  # <root>.<app>.>: where a replica publishes its app's results to requesters
_LIMITS = {"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}


class Refused(Exception):
    """Why a client is refused (sent back to the server, which logs it; the client sees an authorization error)."""


def client_name(token_id: str) -> str:
    """An event client's user name in the server (its ``CONNZ`` ``authorized_user``): ``events.<token id>``."""
    return f"events.{token_id}"


def events_inbox(token_id: str) -> str:
    """The inbox prefix of an event client: the only inbox it may subscribe to."""
    return f"_INBOX.events_{token_id}"


def token_as_user(opts: dict[str, Any]) -> bool:
    """Whether a client gave an Ember token as its user name (refused: the server logs user names)."""
    return not opts.get("auth_token") and str(opts.get("user") or "").startswith(TOKEN_PREFIX)


def token_of(opts: dict[str, Any]) -> str | None:
    """The Ember token a client presented in its CONNECT options (``auth_token``, user ``token`` with the token as
    password, or the token as the user name: refused, but never logged), or None when it presented none."""
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
    """The control plane's system-account connection: find a user's connections, kick them, read the answers;
    nothing else."""
    return {"pub": {"allow": ["$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.KICK"]},
            "sub": {"allow": ["_INBOX.>"]}, **_LIMITS}


def bound_functions(principal: Principal, deployments: Iterable[Deployment]) -> tuple[set[str], set[str]]:
    """The subjects bound (``on=``) by the functions of the apps ``principal`` sees, and the subjects their results
    go to (``result_subject``, and the app's replies to requesters). A reserved subject is left out, whatever a
    deployment says."""
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
                if fn.on:
                    results.add(f"{EVENT_REPLIES_ROOT}.{dep.app}.>")
    return bound, results


def _usable(subject: str) -> bool:
    first = subject.split(".", 1)[0]
    return bool(subject) and not reserved_root(first) and first not in ("*", ">")


def permissions(token_id: str, principal: Principal, deployments: Iterable[Deployment]) -> dict[str, Any]:
    """An event client's ``nats`` claims: publish to its apps' bound subjects, subscribe to their result subjects
    and its own inbox."""
    bound, results = bound_functions(principal, deployments)
    sub = sorted(results | {f"{events_inbox(token_id)}.>"})
    return {"pub": {"allow": sorted(bound), "deny": _DENIED}, "sub": {"allow": sub, "deny": _DENIED_SUB}, **_LIMITS}


def _fingerprint(perms: dict[str, Any]) -> str:
    return json.dumps(perms, sort_keys=True)


@dataclass(frozen=True)
class Admission:
    """What the callout answers for an admitted client: its name, account, permissions and expiry."""

    name: str
    nats: dict[str, Any]
    account: str = "$G"
    expires: float | None = None


class Kicker:
    """Ends a NATS user's connections on every server: finds them (``$SYS.REQ.SERVER.PING.CONNZ`` by user name) and
    kicks each (``$SYS.REQ.SERVER.<id>.KICK``), over the control plane's own connection in the system account. Its
    reconnects then meet the auth callout, which refuses them. Used for revoked tokens and unassigned replicas."""

    def __init__(self, keys: AuthKeys, servers: list[str]) -> None:
        self._keys = keys
        self._servers = servers
        self._system: Client | None = None

    async def close(self) -> None:
        if self._system is not None:
            with contextlib.suppress(Exception):
                await self._system.close()

    async def kick(self, user: str) -> int:
        """Kick every connection of ``user``; how many were kicked. A server lists at most ``CONNZ_PAGE`` of them
        at a time: asked again after each page's kicks (those kicked are no longer listed), until none is listed
        (a user with 1,040 connections kept 16 of them, for good, when one page was all)."""
        system = await self._system_connection()
        query = json.dumps({"user": user, "auth": True, "limit": CONNZ_PAGE}).encode()
        cut = 0
        for _ in range(MAX_CONNZ_PAGES):
            listed = await self._gather(system, "$SYS.REQ.SERVER.PING.CONNZ", query)
            if not listed:
                return cut
            cut_now = 0
            for server_id, cid in listed:
                answer = await system.request(f"$SYS.REQ.SERVER.{server_id}.KICK", json.dumps({"cid": cid}).encode(),
                                              timeout=_KICK_TIMEOUT_S)
                cut_now += b'"error"' not in answer.data
            cut += cut_now
            if not cut_now:  # listed while they close: gone at the next look
                await asyncio.sleep(_QUIET_S)
        raise TimeoutError(f"{user} still has connections after {MAX_CONNZ_PAGES} pages of kicks")  # tried again

    @staticmethod
    async def _gather(system: Client, subject: str, query: bytes) -> list[tuple[str, int]]:
        """Every server's answer to a ``PING`` request (they answer on one inbox): its connections' (server, cid).
        The answers are collected until none came for ``_QUIET_S``."""
        inbox = system.new_inbox()
        sub = await system.subscribe(inbox)
        found: list[tuple[str, int]] = []
        try:
            await system.publish(subject, query, reply=inbox)
            wait = _KICK_TIMEOUT_S
            while True:
                try:
                    msg = await sub.next_msg(timeout=wait)
                except TimeoutError:
                    return found
                wait = _QUIET_S
                data = json.loads(msg.data).get("data") or {}
                found += [(str(data.get("server_id")), int(c["cid"])) for c in data.get("connections") or []]
        finally:
            await sub.unsubscribe()

    async def _system_connection(self) -> Client:
        if self._system is None or self._system.is_closed:
            # A few attempts, not forever: a sweep that cannot connect fails, and the next one connects anew.
            self._system = await nats.connect(self._servers, user=SYSTEM_USER, password=system_password(self._keys),
                                              name="ember-platform-system", max_reconnect_attempts=2,
                                              reconnect_time_wait=0.2, connect_timeout=2)
        return self._system


class EventClients:
    """Admits event clients, and cuts the connections of tokens revoked while this control plane runs."""

    def __init__(self, keys: AuthKeys, tokens: TokenStore | None, deployments: KVMirror[Deployment],
                 servers: list[str] | None = None, kicker: Kicker | None = None) -> None:
        self._keys = keys
        self._tokens = tokens
        self._deployments = deployments
        self._owns_kicker = kicker is None  # else the callout's, shared with the sweep of unassigned replicas
        self._kicker = kicker or Kicker(keys, servers or [])
        self._handled: set[str] = set()  # revoked tokens whose connections were cut (or were revoked before)
        self._failures: dict[str, int] = {}
        self._granted: dict[str, set[str]] = {}  # token id -> the permissions its clients admitted here were given
        self._grants_of = -1  # the deployments' generation they were last compared with
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Revoked long enough ago to have been cut by the control planes that ran then (their reconnects are
        # refused); one revoked lately is cut again (a control plane that stopped before its sweep ran left it).
        long_ago = time.time() - RESWEEP_AT_START_S
        items = self._tokens.mirror.items if self._tokens is not None else {}
        self._handled = {token_id for token_id in self._revoked() if (items[token_id].revoked_at or 0.0) < long_ago}
        self._task = asyncio.create_task(sweep_every(self.sweep, "revoked tokens"), name="event-clients-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._owns_kicker:
            await self._kicker.close()

    def admit(self, token: str) -> Admission:
        """The admission of a client presenting ``token``, or ``Refused``: an unknown, revoked or expired token, one
        without the ``events`` scope, or a control plane that checks no tokens. Its JWT expires with the token."""
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
        perms = permissions(token_id, principal, self._deployments.items.values())
        self._granted.setdefault(token_id, set()).add(_fingerprint(perms))
        return Admission(name=client_name(token_id), nats=perms,
                         expires=stored.info.expires_at if stored is not None else None)

    async def sweep(self) -> int:
        """Cut the connections of the tokens revoked since the last sweep; how many connections were cut."""
        if self._tokens is None:
            return 0
        cut = 0
        for token_id in sorted(self._revoked() - self._handled):
            try:
                cut += await self._cut(token_id)
            except (NatsError, OSError, TimeoutError) as exc:
                tries = self._failures[token_id] = self._failures.get(token_id, 0) + 1
                if tries in (1, 60):
                    log.warning("could not cut the connections of revoked token %s (%s: %s); trying again",
                                token_id, type(exc).__name__, exc)
                continue
            self._handled.add(token_id)
            self._failures.pop(token_id, None)
        self._handled &= set(self._tokens.mirror.items)  # records purged by the collector
        return cut + await self._regrant()

    async def _regrant(self) -> int:
        """Cut the connections this control plane admitted whose permissions a change of deployments altered (a
        subject their app no longer binds, which another tenant's app may bind next): a client's permissions are
        its connection's, given at connect; its reconnect gets what it may do now. How many connections were cut."""
        if self._tokens is None or self._deployments.generation == self._grants_of:
            return 0
        self._grants_of = self._deployments.generation
        deployments = list(self._deployments.items.values())
        cut = 0
        for token_id, given in sorted((t, set(g)) for t, g in self._granted.items()):  # admissions go on meanwhile
            stored = self._tokens.mirror.items.get(token_id)
            if stored is None or stored.revoked_at is not None:  # refused at its reconnect; cut when revoked
                self._granted.pop(token_id, None)
                continue
            now = _fingerprint(permissions(token_id, Principal.of(stored.info), deployments))
            if given == {now}:
                continue
            try:
                kicked = await self._kicker.kick(client_name(token_id))
            except (NatsError, OSError, TimeoutError) as exc:
                log.warning("could not cut the connections of token %s, whose permissions changed (%s: %s); trying "
                            "again", token_id, type(exc).__name__, exc)
                self._grants_of = -1  # looked at again at the next sweep
                continue
            left = self._granted.get(token_id, set()) - (given - {now})  # the reconnects have what they may do now
            if left:
                self._granted[token_id] = left
            else:
                self._granted.pop(token_id, None)
            if kicked:
                log.info("cut %d connections of token %s: its apps' subjects changed", kicked, token_id)
            cut += kicked
        return cut

    def _revoked(self) -> set[str]:
        items = self._tokens.mirror.items if self._tokens is not None else {}
        return {token_id for token_id, stored in items.items() if stored.revoked_at is not None}

    async def _cut(self, token_id: str) -> int:
        """Kick the token's connections on every server; how many."""
        cut = await self._kicker.kick(client_name(token_id))
        if cut:
            log.info("cut %d connections of revoked token %s", cut, token_id)
        return cut


async def sweep_every(sweep: Callable[[], Awaitable[int]], whose: str) -> None:
    """``sweep()`` every ``SWEEP_S`` until cancelled; a pass that fails is logged, and the next one tries again."""
    while True:
        await asyncio.sleep(SWEEP_S)
        try:
            await sweep()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sweeping the connections of %s failed; trying again", whose)
