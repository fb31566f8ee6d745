"""Event subjects have owners: a tenant's app binds its own ``events.<app>`` subjects and what an admin granted it,
never another app's; two apps never bind overlapping subjects; and the grants' bucket is the control plane's
alone (a hostile replica and a node are refused it by the NATS server)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from support.auth import bearer
from support.natsconn import connect as admin_connect
from support.natsconn import kv_value

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import ConflictError, InvalidInputError
from ember.cli import main as ember_cli
from ember.wire import natsflush, subjects
from ember.wire.grants import grant_key
from ember.wire.natscreds import read_file

pytestmark = [
    pytest.mark.integration,
    # nats-py leaves the socket of a closed connection for the garbage collector (an unclosed-transport warning)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

BUCKET = subjects.SUBJECT_GRANTS_BUCKET
BOUND = '''import ember
app = ember.App("{app}")


@app.function(on={on!r}, result_subject={result!r}, min_replicas={replicas}, retries=0)
def shout(word: str) -> str:
    return word.upper()
'''


def grant_attempts(key):
    """What no replica or node may do to the grants' bucket: (what, subject, payload) each, sent as requests."""
    bucket = "ember_subject_grants"
    return [
        ("read a grant", f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}", b""),
        ("read by sequence", f"$JS.API.STREAM.MSG.GET.KV_{bucket}", b'{"seq": 1}'),
        ("watch the grants", f"$JS.API.CONSUMER.CREATE.KV_{bucket}", b"{}"),
        ("write a grant", f"$KV.{bucket}.{key}", b'{"pattern": "orders.>", "apps": ["*"]}'),
        ("purge the grants", f"$JS.API.STREAM.PURGE.KV_{bucket}", b"{}"),
    ]


async def attempt_all(nc, key):
    """Each attempt's outcome: the answer if one came, else the server's refusal (it drops what it refuses, and
    says so on the connection: an attempt ends at that word, not at its request's timeout)."""
    import asyncio

    seen = {}
    for name, subject, payload in grant_attempts(key):
        nc._err = None  # the server's refusal of this attempt lands here
        asked = asyncio.ensure_future(nc.request(subject, payload, timeout=2))
        while not asked.done() and nc.last_error is None:
            await asyncio.sleep(0.005)
        if asked.done() and asked.exception() is None:
            seen[name] = f"answered: {asked.result().data[:200]!r}"
            continue
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
        seen[name] = f"refused: {nc.last_error!r}"
    return seen


# A tenant's app whose code finds its replica's own NATS connection (as any code in a replica can) and tries them.
SNOOP = """import ember
app = ember.App("tenant-snoop")


@app.function(timeout_s=120)
def snoop(key: str) -> dict:
    import asyncio
    import gc

    from nats.aio.client import Client

    gc.unfreeze()  # the replica froze what its start made (its connection too); any code may thaw it to look
    nc = next(o for o in gc.get_objects() if isinstance(o, Client) and o.is_connected)
    loop = next(o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running())
    return asyncio.run_coroutine_threadsafe(attempt_all(nc, key), loop).result(120)


""" + inspect.getsource(grant_attempts) + "\n\n" + inspect.getsource(attempt_all)


@pytest.fixture(scope="module")
def tenant_token(platform, http: httpx.Client) -> str:
    """A deploy token scoped to ``tenant-*``."""
    made = http.post("/v1/tokens", json={"scopes": ["deploy", "invoke", "read"], "apps": ["tenant-*"],
                                         "name": f"tenant-{uuid.uuid4().hex[:6]}"})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


@pytest.fixture(scope="module")
def tenant(platform, tenant_token: str) -> Iterator[Transport]:
    transport = Transport(platform.url, token=tenant_token)
    yield transport
    transport.close()


@pytest.fixture
def granted(http: httpx.Client) -> Iterator[str]:
    """``orders.>`` granted to ``tenant-*`` (through ``ember subject grant``), revoked after the test."""
    assert http.post("/v1/subjects/grant", json={"pattern": "orders.>", "apps": ["tenant-*"]}).status_code == 200
    yield "orders.>"
    http.post("/v1/subjects/revoke", json={"pattern": "orders.>"})


def _app(tmp_path: Path, app: str, on: str, result: str | None = None, replicas: int = 0) -> Path:
    folder = tmp_path / app
    folder.mkdir(parents=True)
    path = folder / f"{app.replace('-', '_')}.py"
    path.write_text(BOUND.format(app=app, on=on, result=result, replicas=replicas))
    return path


def _refused(error: type[Exception], path: Path, transport: Transport) -> Exception:
    with pytest.raises(error) as caught:
        deploy(path, transport=transport, timeout_s=120)
    return caught.value


@pytest.mark.parametrize(("on", "result", "field"), [
    ("events.team-b-app.>", None, "$.manifest.services[0].functions[0].on[0]"),
    ("orders.>", None, "$.manifest.services[0].functions[0].on[0]"),
    ("events.tenant-bad.in", "events.team-b-app.out", "$.manifest.services[0].functions[0].result_subject"),
])
def test_a_tenant_cannot_bind_another_apps_or_an_ungranted_subject(tenant, http, tmp_path, on, result, field):
    error = _refused(InvalidInputError, _app(tmp_path, "tenant-bad", on, result), tenant)
    assert error.field == field, error  # type: ignore[attr-defined]
    assert "ember subject grant" in str(error) and "events.tenant-bad.>" in str(error)
    assert http.get("/v1/apps/tenant-bad").status_code == 404  # nothing was deployed


def test_a_granted_subject_is_bound_and_two_apps_never_overlap(tenant, http, tmp_path, granted):
    first = deploy(_app(tmp_path, "tenant-orders", "orders.eu.>"), transport=tenant, timeout_s=120)
    try:
        assert first.app == "tenant-orders"  # accepted: granted to tenant-*
        clash = _refused(ConflictError, _app(tmp_path, "tenant-clash", "orders.*.created"), tenant)
        assert clash.field == "$.manifest.services[0].functions[0].on[0]"  # type: ignore[attr-defined]
        assert "tenant-orders" not in str(clash) and "orders.eu" not in str(clash)  # who holds it is not told
        # the owner pushes again (a new version binding the same subjects): no conflict with itself
        again = _app(tmp_path / "v2", "tenant-orders", "orders.eu.>", "orders.eu-done")
        assert deploy(again, transport=tenant, timeout_s=120).version == first.version + 1
    finally:
        http.delete("/v1/apps/tenant-orders")
    # revoked, the grant no longer lets a push bind inside it
    assert http.post("/v1/subjects/revoke", json={"pattern": "orders.>", "apps": ["tenant-*"]}).json() is None
    _refused(InvalidInputError, _app(tmp_path, "tenant-late", "orders.us.>"), tenant)


def test_only_an_admin_grants_subjects(platform, tenant_token, http, ember_url, capsys):
    mine = bearer(tenant_token)
    for path, body in [("/v1/subjects/grant", {"pattern": "orders.>", "apps": ["tenant-*"]}),
                       ("/v1/subjects/revoke", {"pattern": "orders.>"})]:
        assert httpx.post(f"{platform.url}{path}", json=body, headers=mine).status_code == 403
    assert httpx.get(f"{platform.url}/v1/subjects", headers=mine).status_code == 403
    # the admin's own door: the CLI
    assert ember_cli(["subject", "grant", "invoices.>", "--apps", "tenant-*,billing"]) == 0
    assert ember_cli(["subject", "ls"]) == 0
    assert "invoices.>" in capsys.readouterr().out
    assert ember_cli(["subject", "revoke", "invoices.>", "--apps", "billing"]) == 0
    assert [g["apps"] for g in http.get("/v1/subjects").json() if g["pattern"] == "invoices.>"] == [["tenant-*"]]
    assert ember_cli(["subject", "revoke", "invoices.>"]) == 0
    assert not [g for g in http.get("/v1/subjects").json() if g["pattern"] == "invoices.>"]
    bad = http.post("/v1/subjects/grant", json={"pattern": "ember.calls.>", "apps": ["tenant-*"]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "$.pattern"
    assert http.post("/v1/subjects/revoke", json={"pattern": "never.granted"}).status_code == 404


def test_an_apps_own_subject_reaches_its_function(platform, tenant, http, tmp_path):
    app = "tenant-echo"
    deploy(_app(tmp_path, app, f"events.{app}.in.>", f"events.{app}.out", replicas=1), transport=tenant,
           timeout_s=120)

    async def exchange() -> nats.aio.msg.Msg:
        nc = await admin_connect(platform.nats_url)
        try:
            results: asyncio.Queue = asyncio.Queue()
            await nc.subscribe(f"events.{app}.out", cb=results.put)
            await natsflush.flush(nc)
            await nc.jetstream().publish(f"events.{app}.in.x", b'"hi"', headers={"Nats-Msg-Id": "echo-1"})
            return await asyncio.wait_for(results.get(), 60)
        finally:
            await nc.close()

    try:
        msg = asyncio.run(exchange())
        assert msg.headers["Ember-Status"] == "succeeded" and json.loads(msg.data) == "HI"
    finally:
        http.delete(f"/v1/apps/{app}")


def test_the_grants_bucket_is_the_control_planes_alone(platform, tenant, http, tmp_path, granted):
    key = grant_key(granted)
    folder = tmp_path / "snoop"
    folder.mkdir()
    (folder / "snoop.py").write_text(SNOOP)
    deploy(folder / "snoop.py", transport=tenant, timeout_s=120)
    try:
        seen = tenant.json("POST", "/v1/tenant-snoop/snoop", json=key)
    finally:
        http.delete("/v1/apps/tenant-snoop")
    node = read_file(platform.node_credentials("grant-reader"))
    seen_by_node = asyncio.run(_attempts_as(platform.nats_url, node.connect_options(), key))
    for who, answers in (("replica", seen), ("node", seen_by_node)):
        assert len(answers) == 5, (who, answers)
        for attempt, answer in answers.items():
            assert "permissions violation" in answer.lower(), (who, attempt, answer)

    # nothing changed, and the control plane reads it as before (the positive twin)
    assert asyncio.run(kv_value(platform.nats_url, BUCKET, key)) is not None
    assert [g["apps"] for g in http.get("/v1/subjects").json() if g["pattern"] == granted] == [["tenant-*"]]
    gc.collect()  # the node's refused-attempt connection's socket, collected under this module's filter


async def _attempts_as(url: str, options: dict, key: str) -> dict[str, str]:
    nc = await nats.connect(url, allow_reconnect=False, **options)
    try:
        return await attempt_all(nc, key)
    finally:
        await nc.close()
