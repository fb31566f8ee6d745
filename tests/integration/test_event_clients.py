"""Producers and consumers of events from outside: a plain nats-py client (no Ember SDK) that presents an Ember
token with the ``events`` scope, and ``POST /v1/events/<subject>``.

Two apps bind subjects: ``ingest-x`` (seen by the ``ingest-*`` token) and ``other-y`` (another tenant's). The
``ingest-*`` client invokes its app's function and reads the result; everything of ``other-y``, and Ember's and the
server's own subjects, are permissions violations; the ``other-*`` token, the owner, may do what it is refused.
Revoking the token closes its connection and refuses the reconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from support.auth import bearer

import ember
from ember.wire import natsflush
from ember_platform.natsauth.clients import CONNZ_PAGE, TOKEN_USER, events_inbox

pytestmark = [
    pytest.mark.integration,
    # nats-py leaves the socket of a refused connection for the garbage collector (an unclosed-transport warning)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("collect_refused_sockets"),
]

APP = '''import ember
app = ember.App("{app}")

@app.function(on="events.{app}.orders.>", result_subject="events.{app}.results", retries=0)
def count(order: dict) -> int:
    return len(order["items"])
'''



@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory, transport) -> Iterator[None]:
    where = tmp_path_factory.mktemp("event-clients")
    for app in ("ingest-x", "other-y"):
        path = Path(where / f"{app.replace('-', '_')}.py")
        path.write_text(APP.format(app=app))
        ember.deploy(path, transport=transport, timeout_s=180)
    yield
    for app in ("ingest-x", "other-y"):
        transport.request("DELETE", f"/v1/apps/{app}")


def _token(http, scopes: list[str], apps: list[str]) -> tuple[str, str]:
    created = http.post("/v1/tokens", json={"scopes": scopes, "apps": apps, "name": "event client"})
    assert created.status_code == 201, created.text
    return created.json()["token"], created.json()["info"]["id"]


class Client:
    """A plain nats-py client with the errors the server sent it (asynchronous permissions violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.closed = asyncio.Event()
        self.nc: nats.NATS | None = None

    async def connect(self, url: str, token: str, token_id: str, **options) -> nats.NATS:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        async def on_closed() -> None:
            self.closed.set()

        self.nc = await nats.connect(url, token=token, inbox_prefix=events_inbox(token_id), error_cb=on_error,
                                     closed_cb=on_closed, connect_timeout=5, **options)
        return self.nc

    async def violation(self, what: str) -> str:
        """Wait for the server's permissions violation that names ``what``."""
        assert self.nc is not None
        await natsflush.flush(self.nc)
        for _ in range(100):
            found = [e for e in self.errors if "permissions violation" in e.lower() and what.lower() in e.lower()]
            if found:
                return found[0]
            await asyncio.sleep(0.05)
        raise AssertionError(f"no permissions violation for {what!r}: {self.errors}")


def test_a_plain_client_with_an_events_token_invokes_its_apps_function(platform, http, apps):
    token, token_id = _token(http, ["events"], ["ingest-*"])

    async def exchange() -> tuple[dict, list]:
        client = Client()
        nc = await client.connect(platform.nats_url, token, token_id)
        results = await nc.subscribe("events.ingest-x.results")
        await natsflush.flush(nc)
        ack = await nc.jetstream().publish("events.ingest-x.orders.1", json.dumps({"items": [1, 2, 3]}).encode(),
                                           headers={"Nats-Msg-Id": "order-1"})  # its ack comes to its own inbox
        await nc.publish("events.ingest-x.orders.2", json.dumps({"items": [1]}).encode())  # a core publish too
        got = sorted([json.loads((await results.next_msg(timeout=120)).data) for _ in range(2)])
        await nc.close()
        return {"stream": ack.stream, "results": got}, client.errors

    got, errors = asyncio.run(exchange())
    assert got["stream"].startswith("EMBER_EV_") and got["results"] == [1, 3]
    assert not errors

    async def as_user_and_password() -> list:  # the other spelling: user "token", the token as its password
        nc = await nats.connect(platform.nats_url, user=TOKEN_USER, password=token,
                                inbox_prefix=events_inbox(token_id), connect_timeout=5)
        ack = await nc.jetstream().publish("events.ingest-x.orders.3", b'{"items": []}')
        await nc.close()
        return [ack.seq]

    assert asyncio.run(as_user_and_password())


def test_another_apps_subjects_and_embers_own_are_refused_to_an_events_client(platform, http, apps):
    token, token_id = _token(http, ["events"], ["ingest-*"])
    owner, owner_id = _token(http, ["events"], ["other-*"])

    async def attempts() -> tuple[list[str], list[str]]:
        client = Client()
        nc = await client.connect(platform.nats_url, token, token_id)
        refused = []
        for subject in ("events.other-y.orders.1", "ember.calls.default.other-y.count", "$JS.API.STREAM.NAMES",
                        "$KV.ember_calls.s.x", "_INBOX.someone-else"):
            await nc.publish(subject, b'{"items": [1]}')
            refused.append(await client.violation(f'"{subject}"'))
        for subject in ("events.other-y.results", "_INBOX.>", "$JS.API.>", "events.>"):
            await nc.subscribe(subject)
            refused.append(await client.violation(f'"{subject}"'))
        await nc.close()

        # The owner, another tenant's events token, may do exactly what was refused on its app.
        other = Client()
        onc = await other.connect(platform.nats_url, owner, owner_id)
        results = await onc.subscribe("events.other-y.results")
        await onc.jetstream().publish("events.other-y.orders.9", b'{"items": [1, 2]}')
        answer = await results.next_msg(timeout=120)
        await onc.close()
        return refused, [answer.data.decode(), *other.errors]

    refused, owner_saw = asyncio.run(attempts())
    assert all("permissions violation" in r.lower() for r in refused)
    assert owner_saw == ["2"]


def test_a_token_without_the_events_scope_or_an_unknown_one_is_refused_at_connect(platform, http, apps):
    invoke, invoke_id = _token(http, ["invoke"], ["ingest-*"])

    async def refused(**options) -> str:
        try:
            nc = await nats.connect(platform.nats_url, allow_reconnect=False, max_reconnect_attempts=0,
                                    connect_timeout=5, **options)
        except Exception as exc:
            return type(exc).__name__
        await nc.close()
        return "connected"

    assert asyncio.run(refused(token=invoke)) != "connected"
    assert asyncio.run(refused(token=invoke.replace(invoke_id, "nosuchtoken"))) != "connected"
    assert asyncio.run(refused(user=TOKEN_USER, password="ember_x_" + "a" * 32)) != "connected"


def test_revoking_the_token_closes_its_connection_and_refuses_the_reconnect(platform, http, apps):
    token, token_id = _token(http, ["events"], ["ingest-*"])

    async def revoke_while_connected() -> tuple[bool, str]:
        client = Client()
        nc = await client.connect(platform.nats_url, token, token_id, max_reconnect_attempts=3,
                                  reconnect_time_wait=0.2)
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        second = await nats.connect(platform.nats_url, user=TOKEN_USER, password=token, closed_cb=on_closed,
                                    inbox_prefix=events_inbox(token_id), max_reconnect_attempts=3,
                                    reconnect_time_wait=0.2)  # the other spelling, a connection of its own
        await nc.jetstream().publish("events.ingest-x.orders.4", b'{"items": []}')  # connected, and it may publish
        await second.jetstream().publish("events.ingest-x.orders.5", b'{"items": []}')
        revoked = await asyncio.to_thread(http.delete, f"/v1/tokens/{token_id}")
        assert revoked.status_code == 200, revoked.text
        await asyncio.wait_for(client.closed.wait(), 60)  # cut, then every reconnect refused: closed for good
        await asyncio.wait_for(closed.wait(), 60)
        try:
            again = await nats.connect(platform.nats_url, token=token, allow_reconnect=False,
                                       max_reconnect_attempts=0, connect_timeout=5)
        except (NatsError, OSError) as exc:
            return nc.is_closed and second.is_closed, type(exc).__name__
        await again.close()
        return nc.is_closed, "connected"

    closed, reconnect = asyncio.run(revoke_while_connected())
    assert closed and reconnect != "connected"


def test_revoking_a_token_closes_more_connections_than_a_server_lists_at_once(platform, http, apps):
    """A server lists a user's connections a page (``CONNZ_PAGE``) at a time: the kick goes on past the first page
    (a token with 1,040 connections kept 16 of them, for good, with the token's permissions)."""
    token, token_id = _token(http, ["events"], ["ingest-*"])

    async def revoke_many() -> int:
        closed = asyncio.Semaphore(0)

        async def on_closed() -> None:
            closed.release()

        async def one() -> nats.NATS:
            return await nats.connect(platform.nats_url, user=TOKEN_USER, password=token, closed_cb=on_closed,
                                      inbox_prefix=events_inbox(token_id), allow_reconnect=False, connect_timeout=30)

        many = []
        for _ in range(CONNZ_PAGE // 64 + 1):  # a page and 64 more, in groups of 64 (each a callout round trip)
            many += await asyncio.gather(*(one() for _ in range(64)))
        try:
            revoked = await asyncio.to_thread(http.delete, f"/v1/tokens/{token_id}")
            assert revoked.status_code == 200, revoked.text
            for _ in many:
                await asyncio.wait_for(closed.acquire(), 60)
            return sum(nc.is_closed for nc in many)
        finally:
            await asyncio.gather(*(nc.close() for nc in many if not nc.is_closed))

    assert asyncio.run(revoke_many()) == CONNZ_PAGE + 64


def test_a_client_loses_a_subject_its_app_no_longer_binds(platform, http, apps, transport, tmp_path: Path):
    """Permissions are a connection's, given at connect: when its app stops binding a subject (which another tenant's
    app may bind next), the client's connections are cut, and its reconnect may no longer publish there."""
    path = tmp_path / "ingest_z.py"
    path.write_text(APP.format(app="ingest-z"))
    ember.deploy(path, transport=transport, timeout_s=180)
    token, token_id = _token(http, ["events"], ["ingest-z"])

    async def after_the_app_goes() -> str:
        client = Client()
        reconnected = asyncio.Event()

        async def on_reconnected() -> None:
            reconnected.set()

        nc = await client.connect(platform.nats_url, token, token_id, reconnected_cb=on_reconnected,
                                  reconnect_time_wait=0.2)
        try:
            await nc.jetstream().publish("events.ingest-z.orders.1", b'{"items": []}')  # bound: stored
            assert (await asyncio.to_thread(http.delete, "/v1/apps/ingest-z")).status_code == 204
            await asyncio.wait_for(reconnected.wait(), 60)
            await nc.publish("events.other-y.orders.2", b'{"items": []}')  # binding nothing allows nothing
            await client.violation("events.other-y.orders.2")
            await nc.publish("events.ingest-z.orders.2", b'{"items": []}')
            return await client.violation("events.ingest-z.orders.2")
        finally:
            await nc.close()

    assert "publish" in asyncio.run(after_the_app_goes()).lower()


def test_publishing_over_http_needs_the_events_scope_and_a_subject_of_its_apps(platform, http, apps):
    token, _ = _token(http, ["events"], ["ingest-*"])
    invoke, _ = _token(http, ["invoke", "read"], ["ingest-*"])

    def post(subject: str, body: bytes = b'{"items": [1, 2]}', who: str = token):
        return http.post(f"/v1/events/{subject}", content=body, headers=bearer(who))

    first = post("events.ingest-x.orders.http")
    assert first.status_code == 202, first.text
    assert first.json()["seq"] > 0 and first.json()["stream"].startswith("EMBER_EV_")
    assert http.post("/v1/events/events.other-y.orders.1", content=b"{}").status_code == 202  # the admin: any app

    other = post("events.other-y.orders.1")
    nothing = post("events.nobody.orders.1")
    assert other.status_code == nothing.status_code == 404
    assert other.json()["error"]["message"].replace("other-y", "X") == \
        nothing.json()["error"]["message"].replace("nobody", "X")  # no hint that the other app's subject exists
    for bad in ("events.ingest-x.orders.*", "events.ingest-x.orders.>", "events..x", "ember.calls.x",
                "$JS.API.STREAM.NAMES", "x" * 300, "events.ingest-x.a b"):
        answer = post(bad.replace(" ", "%20"))
        assert answer.status_code == 422, (bad, answer.status_code, answer.text)
        assert answer.json()["error"]["field"] == "subject"
    assert post("events.ingest-x.orders.big", b"x" * (9 * 1024 * 1024)).status_code == 413
    # A body of NATS's whole max_payload (8 MiB here) leaves no room for its headers: a 413, not a message the
    # server answers by closing the control plane's connection (a 503 "retry" before, and every call beside it cut).
    full = http.post("/v1/events/events.ingest-x.orders.full", content=b"x" * (8 * 1024 * 1024),
                     headers={**bearer(token), "Idempotency-Key": "k" * 128})
    assert full.status_code == 413, full.text
    assert post("events.ingest-x.orders.http").status_code == 202
    assert post("events.ingest-x.orders.http", who=invoke).status_code == 403


def test_ember_events_publish_prints_the_stored_sequence(platform, http, apps, ember_cli):
    token, _ = _token(http, ["events"], ["ingest-*"])
    done = ember_cli("events", "publish", "events.ingest-x.orders.cli", "--data", '{"items": [1]}',
                     url=platform.url, token=token)
    assert "sequence" in done.stdout and "EMBER_EV_" in done.stdout
    refused = ember_cli("events", "publish", "events.other-y.orders.cli", "--data", "{}", url=platform.url,
                        token=token, check=False)
    assert refused.returncode == 1 and "NotFoundError" in refused.stderr
