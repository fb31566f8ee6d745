"""What the auth callout grants an event client (a plain NATS client presenting an ``events`` token), and what it
refuses, without a server (tests/integration/test_event_clients.py runs the real nats-server against it)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import pytest

from ember.wire import Deployment, FunctionSpec, Manifest, ServiceSpec
from ember.wire.subjects import matches
from ember.wire.tokens import StoredToken, TokenInfo, new_token, parse_token, secret_digest
from ember_platform.auth.tokens import TokenStore
from ember_platform.natsauth import clients, keys
from ember_platform.natsauth.callout import AuthCallout, Refused
from ember_platform.natsauth.clients import events_inbox


class _Mirror:
    def __init__(self, items: dict) -> None:
        self.items = items
        self.generation = 1


def _deployment(app: str, on: list[str], result: str | None) -> Deployment:
    fn = FunctionSpec(name="f", attr="f", input_mode="single", on=on, result_subject=result)
    plain = FunctionSpec(name="g", attr="g", input_mode="single")
    services = [ServiceSpec(name="svc", kind="function", functions=[fn, plain])]
    return Deployment(app=app, version=1, bundle_sha256="0" * 64, created_at=0.0,
                      manifest=Manifest(app=app, module="m", services=services))


DEPLOYMENTS = {
    "ingest-x": _deployment("ingest-x", ["events.ingest-x.orders.>"], "events.ingest-x.results"),
    "other-y": _deployment("other-y", ["events.other-y.>"], "events.other-y.results"),
}


def _store(**tokens: tuple[list[str], list[str], float | None, bool]) -> tuple[TokenStore, dict[str, str]]:
    store = TokenStore(None, enabled=True)  # type: ignore[arg-type]  # never started: its mirror is filled here
    issued = {}
    for name, (scopes, apps, expires_at, revoked) in tokens.items():
        token = new_token(name)
        token_id, secret = parse_token(token) or ("", "")
        info = TokenInfo(id=token_id, name=name, scopes=scopes, apps=apps, created_at=0.0, expires_at=expires_at)
        store.mirror.items[token_id] = StoredToken(info=info, secret_sha256=secret_digest(secret),
                                                   revoked_at=1.0 if revoked else None)
        issued[name] = token
    return store, issued


@pytest.fixture(scope="module")
def auth() -> keys.AuthKeys:
    return keys.generate()


def _callout(auth: keys.AuthKeys, store: TokenStore | None) -> AuthCallout:
    return AuthCallout(nc=None, keys=auth, assignments=_Mirror({}), deployments=_Mirror(DEPLOYMENTS),  # type: ignore[arg-type]
                       tokens=store)


def _allowed(perms: dict, kind: str, subject: str) -> bool:
    return any(matches(p, subject) for p in perms[kind]["allow"]) \
        and not any(matches(p, subject) for p in perms[kind].get("deny", []))


def test_an_events_token_may_publish_its_apps_bound_subjects_and_read_their_results_only(auth):
    store, issued = _store(ingest=(["events"], ["ingest-*"], None, False))
    admitted = _callout(auth, store).admit({"auth_token": issued["ingest"]})
    perms = admitted.nats
    assert admitted.name == "events.ingest" and admitted.account == "$G"
    assert _allowed(perms, "pub", "events.ingest-x.orders.1")
    assert _allowed(perms, "sub", "events.ingest-x.results")
    assert _allowed(perms, "sub", f"{events_inbox('ingest')}.abc")
    assert _allowed(perms, "sub", "_EMBER.replies.ingest-x.abc")  # its app's replies to an Ember-Reply-To
    for subject in ("events.other-y.orders.1", "events.ingest-x.results", "ember.calls.default.ingest-x.f",
                    "$JS.API.STREAM.NAMES", "$KV.ember_calls.s.x", "_INBOX.x", "$SYS.REQ.SERVER.PING"):
        assert not _allowed(perms, "pub", subject), subject
    for subject in ("events.other-y.results", "_INBOX.x", "_INBOX.events_other.x", "$JS.API.INFO", ">",
                    "_EMBER.replies.other-y.abc", "_EMBER.answers.gw.ingest-x.1"):
        assert not _allowed(perms, "sub", subject), subject
    assert admitted.expires is None  # no expiry of its own: revoking the token cuts it


@pytest.mark.parametrize("opts", [lambda t: {"auth_token": t}, lambda t: {"user": "token", "pass": t}])
def test_every_spelling_of_the_token_is_admitted(auth, opts):
    store, issued = _store(ingest=(["events"], ["ingest-*"], None, False))
    assert _callout(auth, store).admit(opts(issued["ingest"])).name == "events.ingest"


def test_a_token_given_as_the_user_name_is_refused(auth):
    """nats-server writes a client's user name in its log (its auth errors, a callout that answers late): a token
    there would be written too."""
    store, issued = _store(ingest=(["events"], ["ingest-*"], None, False))
    with pytest.raises(Refused, match="never as the user name") as refused:
        _callout(auth, store).admit({"user": issued["ingest"]})
    assert issued["ingest"] not in str(refused.value)


def test_the_token_expiry_bounds_the_connection(auth):
    soon = time.time() + 120
    store, issued = _store(ingest=(["events"], ["ingest-*"], soon, False))
    assert _callout(auth, store).admit({"auth_token": issued["ingest"]}).expires == soon


@pytest.mark.parametrize(("token", "why"), [
    ((["invoke", "read"], ["ingest-*"], None, False), "events scope"),
    ((["events"], ["ingest-*"], None, True), "revoked"),
    ((["events"], ["ingest-*"], 10.0, False), "expired"),
])
def test_a_token_without_the_scope_revoked_or_expired_is_refused(auth, token, why):
    store, issued = _store(t=token)
    with pytest.raises(Refused, match=why):
        _callout(auth, store).admit({"auth_token": issued["t"]})


def test_unknown_tokens_and_a_control_plane_without_tokens_refuse(auth):
    store, issued = _store(ingest=(["events"], ["ingest-*"], None, False))
    forged = issued["ingest"][:-4] + "AAAA"
    for opts in ({"auth_token": forged}, {"user": "token", "pass": ""}, {"auth_token": "x" * 1000}):
        with pytest.raises(Refused):
            _callout(auth, store).admit(opts)
    with pytest.raises(Refused, match="checks no tokens"):
        _callout(auth, None).admit({"auth_token": issued["ingest"]})
    with pytest.raises(Refused, match="checks no tokens"):
        _callout(auth, TokenStore(None, enabled=False)).admit({"auth_token": issued["ingest"]})  # type: ignore[arg-type]


def test_only_the_derived_password_enters_the_system_account_and_it_may_only_kick(auth):
    callout = _callout(auth, None)
    admitted = callout.admit({"user": clients.SYSTEM_USER, "pass": clients.system_password(auth)})
    assert admitted.account == "$SYS"
    assert admitted.nats["pub"]["allow"] == ["$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.KICK"]
    with pytest.raises(Refused):
        callout.admit({"user": clients.SYSTEM_USER, "pass": clients.system_password(keys.generate())})



def test_a_sweep_cuts_only_tokens_revoked_while_it_runs_and_retries_until_it_can():
    store, _ = _store(old=(["events"], ["*"], None, True), live=(["events"], ["*"], None, False))
    event_clients = clients.EventClients(keys.generate(), store, _Mirror(DEPLOYMENTS),  # type: ignore[arg-type]
                                         servers=["nats://127.0.0.1:1"])  # nothing listens: a cut fails

    async def run() -> tuple[int, int]:
        await event_clients.start()
        try:
            before = await event_clients.sweep()  # "old" was revoked before it started: cut by then, not again
            stored = store.mirror.items["live"]
            store.mirror.items["live"] = msgspec.structs.replace(stored, revoked_at=time.time())
            after = await event_clients.sweep()  # "live" is revoked now: it tries, fails, and will try again
            return before, after
        finally:
            await event_clients.stop()

    assert asyncio.run(run()) == (0, 0)
    assert "live" not in event_clients._handled and "old" in event_clients._handled
    assert event_clients._failures["live"] == 1


def test_a_control_plane_starting_cuts_again_the_tokens_revoked_lately():
    """One that stopped before its sweep ran (a restart just after ``ember token revoke``) left the token's
    connections open; every control plane starting took every revoked token for cut, for good."""
    store, _ = _store(old=(["events"], ["*"], None, True), lately=(["events"], ["*"], None, True))
    stored = store.mirror.items["lately"]
    store.mirror.items["lately"] = msgspec.structs.replace(stored, revoked_at=time.time() - 60)
    event_clients = clients.EventClients(keys.generate(), store, _Mirror(DEPLOYMENTS),  # type: ignore[arg-type]
                                         servers=["nats://127.0.0.1:1"])  # nothing listens: a cut fails

    async def run() -> None:
        await event_clients.start()
        try:
            await event_clients.sweep()  # "lately" is tried (and fails here), "old" is not
        finally:
            await event_clients.stop()

    asyncio.run(run())
    assert event_clients._failures == {"lately": 1} and event_clients._handled == {"old"}


class _KickerThatLosesACancel:
    """A kick whose connect is refused in the same turn as the sweep's cancellation: ``asyncio.wait_for`` (Python
    3.11) then returns the refusal, not the cancellation, and nats-py tries its next server. Later kicks wait."""

    def __init__(self) -> None:
        self.kicks = 0
        self.entered = asyncio.Event()

    async def kick(self, user: str) -> int:
        self.kicks += 1
        self.entered.set()
        if self.kicks == 1:
            with contextlib.suppress(asyncio.CancelledError):  # lost, as the race above loses it
                await asyncio.sleep(60)
            raise OSError("connect call failed")
        await asyncio.sleep(60)
        return 0

    async def close(self) -> None:
        pass


def test_the_sweep_stops_though_a_kick_lost_its_cancellation():
    store, _ = _store(live=(["events"], ["*"], None, False))
    kicker = _KickerThatLosesACancel()
    event_clients = clients.EventClients(keys.generate(), store, _Mirror(DEPLOYMENTS),  # type: ignore[arg-type]
                                         kicker=kicker)  # type: ignore[arg-type]

    async def run() -> bool:
        await event_clients.start()
        stored = store.mirror.items["live"]
        store.mirror.items["live"] = msgspec.structs.replace(stored, revoked_at=time.time())  # the next sweep kicks
        await asyncio.wait_for(kicker.entered.wait(), 10)
        stopping = asyncio.ensure_future(event_clients.stop())
        await asyncio.wait({stopping}, timeout=10)  # not wait_for: its own cancel on timeout would end the sweep
        sweeping = event_clients._task
        for task in (stopping, sweeping):  # whatever happened, nothing is left running
            if task is not None and not task.done():
                task.cancel()
        return stopping.done() and not stopping.cancelled()

    assert asyncio.run(run())  # it waited for ever on the sweep, which went on after losing its cancellation
    assert kicker.kicks in (1, 2)
