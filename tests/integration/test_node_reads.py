"""A node reads only what is assigned to it: its own assignment, and the bundles, volume versions and chunks of the
replicas assigned to it, through a control plane (``ember.node.<node id>.fetch``). The stores themselves are closed
to every node.

A rogue node (its own, valid node credentials, connected as an agent connects) tries to read the session node's
assignment, the bundle of ``hello`` and a volume (its version and its chunk) that a replica of the session node
mounts: directly in the stores (a permissions violation each) and through a control plane ("not found", as for
what does not exist). The positive twin is the session node, which reads each of them, and whose replica reads its
volume.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import uuid
from typing import Any

import msgspec
import nats
import pytest
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from support.natsconn import connect as admin_connect
from support.natsconn import ends_refused

from ember._client import Transport
from ember._deploy import deploy
from ember._volume import put_volume
from ember.wire import NodeAssignment, VolumeVersion, subjects
from ember.wire.natscreds import read_file
from ember.wire.nodereads import ERROR_HEADER, NOT_FOUND, SIZE_HEADER, FetchRequest
from ember_platform.control.node_reads import build_grant
from ember_platform.natsauth import keys as auth_keys

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
ROGUE = "rogue-reader"
READER = '''import hashlib, os
import ember
app = ember.App("{app}")

@app.function(volumes={{"/weights": ember.Volume("{volume}")}})
def digest() -> str:
    with open(os.path.join(ember.mounted("/weights"), "w.bin"), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()
'''


@pytest.fixture(scope="module")
def mounted(platform, transport: Transport, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An app whose replica (on the session node) mounts a small volume: the app, the volume version's key, the
    chunk's sha256 and the content's sha256."""
    folder = tmp_path_factory.mktemp("node-reads")
    data = uuid.uuid4().bytes * 64
    (folder / "w.bin").write_bytes(data)
    volume = f"nr-{uuid.uuid4().hex[:6]}"
    put_volume(volume, [folder / "w.bin"], transport=transport)
    app = f"node-reads-{uuid.uuid4().hex[:4]}"
    source = folder / app / f"{app.replace('-', '_')}.py"
    source.parent.mkdir()
    source.write_text(READER.format(app=app, volume=volume))
    deploy(source, transport=transport, timeout_s=120)
    content = hashlib.sha256(data).hexdigest()
    return {"app": app, "volume": f"{volume}.1", "chunk": content, "content": content}


def _assignment(platform) -> NodeAssignment:  # type: ignore[no-untyped-def]
    async def read() -> bytes:
        nc = await admin_connect(platform.nats_url)
        try:
            kv = await nc.jetstream().key_value(subjects.ASSIGNMENTS_BUCKET)
            return (await kv.get(platform.node_id)).value or b""
        finally:
            await nc.close()

    return msgspec.json.decode(asyncio.run(read()), type=NodeAssignment)


async def _node(platform, node_id: str, violations: list[str]) -> nats.NATS:  # type: ignore[no-untyped-def]
    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    creds = read_file(platform.node_credentials(node_id))
    return await nats.connect(platform.nats_url, name=f"ember-agent-{node_id}", error_cb=on_error,
                              allow_reconnect=False, **creds.connect_options())


async def _fetch(nc: nats.NATS, node_id: str, kind: str, name: str = "", grant: str = "") -> tuple[bytes, str]:
    """What a control plane answers ``node_id``'s request for ``kind``/``name``: (the first piece, its error)."""
    request = msgspec.json.encode(FetchRequest(kind=kind, name=name, grant=grant))  # type: ignore[arg-type]
    msg = await nc.request(subjects.node_fetch(node_id), request, timeout=30)
    headers = msg.headers or {}
    assert headers.get(ERROR_HEADER) or int(headers[SIZE_HEADER]) == len(msg.data)  # small: one piece
    return msg.data, headers.get(ERROR_HEADER, "")


async def _refused(nc: nats.NATS, violations: list[str], attempt: Any) -> bool:
    """Whether ``attempt`` (a request) is dropped by the server as a permissions violation."""
    said = len(violations)
    return await ends_refused(attempt, violations) and any("permissions violation" in v.lower()
                                                           for v in violations[said:])


def test_a_node_reads_no_other_nodes_assignment(platform, hello) -> None:
    victim = platform.node_id
    key = f"$KV.{subjects.ASSIGNMENTS_BUCKET}.{victim}"
    stream = f"KV_{subjects.ASSIGNMENTS_BUCKET}"

    async def as_rogue() -> dict[str, Any]:
        violations: list[str] = []
        nc = await _node(platform, ROGUE, violations)
        try:
            js = nc.jetstream(timeout=2)
            kv = KeyValue(name=subjects.ASSIGNMENTS_BUCKET, stream=stream, pre=f"$KV.{subjects.ASSIGNMENTS_BUCKET}.",
                          js=js, direct=True)  # opened by name: a node may not ask about the stream
            seen: dict[str, Any] = {
                "get": await _refused(nc, violations, kv.get(victim)),
                "direct get": await _refused(nc, violations, nc.request(f"$JS.API.DIRECT.GET.{stream}.{key}", b"",
                                                                        timeout=2)),
                "watch": await _refused(nc, violations, kv.watch(victim)),
                "watch all": await _refused(nc, violations, kv.watchall()),
            }
            said = len(violations)
            await nc.subscribe(key)
            await nc.flush(timeout=5)
            for _ in range(100):  # the server says so asynchronously
                if len(violations) > said:
                    break
                await asyncio.sleep(0.1)
            seen["subscribe"] = "permissions violation for subscription" in violations[-1].lower()
            seen["fetch its name"] = await _fetch(nc, ROGUE, "assignment", victim)  # the name is not heard
            return seen
        finally:
            await nc.close()

    seen = asyncio.run(as_rogue())
    gc.collect()
    for refused in ("get", "direct get", "watch", "watch all", "subscribe"):
        assert seen[refused] is True, (refused, seen)
    assert seen["fetch its name"] == (b"", "")  # its own assignment: it has none

    async def as_owner() -> bytes:  # the positive twin: the session node reads its own
        nc = await _node(platform, victim, [])
        try:
            data, error = await _fetch(nc, victim, "assignment")
            assert not error
            return data
        finally:
            await nc.close()

    own = msgspec.json.decode(asyncio.run(as_owner()), type=NodeAssignment)
    assert any(s.app == hello.app for s in own.slots)


def test_a_node_reads_only_the_bundles_and_volumes_of_its_replicas(platform, hello, mounted, http) -> None:
    slots = _assignment(platform).slots
    bundle = next(s.bundle_sha256 for s in slots if s.app == hello.app)
    assert any(m.name == mounted["volume"].split(".")[0] for s in slots for m in s.volumes)
    asks = [("bundle", bundle), ("volume", mounted["volume"]), ("chunk", mounted["chunk"])]
    chunks = f"OBJ_{subjects.VOLUME_CHUNKS_STORE}"
    bundles = f"OBJ_{subjects.BUNDLES_STORE}"

    async def as_rogue() -> dict[str, Any]:
        violations: list[str] = []
        nc = await _node(platform, ROGUE, violations)
        try:
            js = nc.jetstream(timeout=2)
            seen: dict[str, Any] = {kind: await _fetch(nc, ROGUE, kind, name) for kind, name in asks}
            seen["absent"] = await _fetch(nc, ROGUE, "bundle", "0" * 64)
            for listed in ("KV_ember_calls", chunks, bundles):  # a stream's info lists its keys or objects' names
                seen[f"list {listed}"] = await _refused(nc, violations, js.stream_info(
                    listed, subjects_filter=">"))
            store = ObjectStore(name=subjects.BUNDLES_STORE, stream=bundles, js=js)  # opened by name: no info
            seen["bundle get"] = await _refused(nc, violations, store.get(bundle))
            seen["bundle msg get"] = await _refused(nc, violations, js.get_last_msg(
                bundles, f"$O.{subjects.BUNDLES_STORE}.>"))
            volumes = KeyValue(name=subjects.VOLUMES_BUCKET, stream=f"KV_{subjects.VOLUMES_BUCKET}",
                               pre=f"$KV.{subjects.VOLUMES_BUCKET}.", js=js, direct=True)
            seen["volume get"] = await _refused(nc, violations, volumes.get(mounted["volume"]))
            seen["chunk direct get"] = await _refused(nc, violations, js.get_msg(
                chunks, seq=1, subject=f"$O.{subjects.VOLUME_CHUNKS_STORE}.C.>", direct=True, next=True))
            seen["chunk consumer"] = await _refused(nc, violations, js.subscribe(
                f"$O.{subjects.VOLUME_CHUNKS_STORE}.C.>", stream=chunks, ordered_consumer=True))
            return seen
        finally:
            await nc.close()

    seen = asyncio.run(as_rogue())
    gc.collect()
    for kind in ("bundle", "volume", "chunk", "absent"):
        assert seen[kind] == (b"", NOT_FOUND), (kind, seen[kind])  # the same for what exists and what does not
    for refused in ("bundle get", "bundle msg get", "volume get", "chunk direct get", "chunk consumer",
                    "list KV_ember_calls", f"list {chunks}", f"list {bundles}"):
        assert seen[refused] is True, (refused, seen)

    async def as_owner() -> dict[str, tuple[bytes, str]]:  # the positive twin: the session node reads each
        nc = await _node(platform, platform.node_id, [])
        try:
            return {kind: await _fetch(nc, platform.node_id, kind, name) for kind, name in asks}
        finally:
            await nc.close()

    own = asyncio.run(as_owner())
    assert all(not error for _, error in own.values()), own
    assert hashlib.sha256(own["bundle"][0]).hexdigest() == bundle
    assert msgspec.json.decode(own["volume"][0], type=VolumeVersion).files[0].chunks == [mounted["chunk"]]
    assert hashlib.sha256(own["chunk"][0]).hexdigest() == mounted["chunk"]
    assert http.post(f"/v1/{mounted['app']}/digest").json() == mounted["content"]  # its replica reads it



def test_a_builds_grant_opens_its_bundle_to_its_node_alone(platform, hello) -> None:
    """A build's bundle is read with the grant its build request carried (signed with a key every control plane
    derives from the NATS auth secret): any control plane answers it, for that node and that bundle only. A grant
    made up, or one given to another node, opens nothing."""
    key = auth_keys.load(platform.auth_dir).build_grant_key()
    bundle = next(s.bundle_sha256 for s in _assignment(platform).slots if s.app == hello.app)

    async def as_rogue() -> dict[str, tuple[bytes, str]]:
        nc = await _node(platform, ROGUE, [])
        try:
            return {
                "made up": await _fetch(nc, ROGUE, "bundle", bundle, grant="0" * 64),
                "another node's": await _fetch(nc, ROGUE, "bundle", bundle,
                                               grant=build_grant(key, platform.node_id, bundle)),
                "its own": await _fetch(nc, ROGUE, "bundle", bundle, grant=build_grant(key, ROGUE, bundle)),
            }
        finally:
            await nc.close()

    seen = asyncio.run(as_rogue())
    gc.collect()
    assert seen["made up"] == (b"", NOT_FOUND) and seen["another node's"] == (b"", NOT_FOUND)
    data, error = seen["its own"]  # the positive twin: a control plane that asked for no build answers it
    assert error == "" and hashlib.sha256(data).hexdigest() == bundle


def test_a_nodes_malformed_or_hostile_reads_are_answered_not_found_and_reads_go_on(platform, hello) -> None:
    """The fetch subject's requests are a node's words: bodies that are not a FetchRequest, unknown kinds, names
    that are paths or NATS wildcards, offsets before the start or past the end. Each gets "not found" (or, past
    the end, an empty piece and the size), never an exception, and the node's own reads go on."""
    node = platform.node_id
    bundle = next(s.bundle_sha256 for s in _assignment(platform).slots if s.app == hello.app)
    hostile = {
        "not json": b"\xff\x00{",
        "a list": b"[1, 2]",
        "no kind": b'{"name": "x"}',
        "unknown kind": b'{"kind": "secret", "name": "team-b-db"}',
        "kind not a string": b'{"kind": 7}',
        "offset not a number": msgspec.json.encode({"kind": "bundle", "name": bundle, "offset": "0"}),
        "a path": msgspec.json.encode({"kind": "bundle", "name": f"../{bundle}"}),
        "a wildcard": msgspec.json.encode({"kind": "chunk", "name": ">"}),
        "a volume key with a wildcard": msgspec.json.encode({"kind": "volume", "name": "*.1"}),
        "deep": b'{"kind": "bundle", "name": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    }

    async def ask(nc: nats.NATS, body: bytes) -> tuple[bytes, dict[str, str]]:
        msg = await nc.request(subjects.node_fetch(node), body, timeout=30)
        return msg.data, dict(msg.headers or {})

    async def as_node() -> dict[str, tuple[bytes, dict[str, str]]]:
        nc = await _node(platform, node, [])
        try:
            seen = {what: await ask(nc, body) for what, body in hostile.items()}
            for what, offset in (("before the start", -5), ("past the end", 10**12)):
                seen[what] = await ask(nc, msgspec.json.encode({"kind": "bundle", "name": bundle, "offset": offset}))
            seen["then its own read"] = await ask(nc, msgspec.json.encode({"kind": "bundle", "name": bundle}))
            return seen
        finally:
            await nc.close()

    seen = asyncio.run(as_node())
    gc.collect()
    for what in hostile:
        assert seen[what] == (b"", {ERROR_HEADER: NOT_FOUND}), (what, seen[what])
    whole, headers = seen["then its own read"]
    assert ERROR_HEADER not in headers and hashlib.sha256(whole).hexdigest() == bundle
    assert seen["past the end"] == (b"", {SIZE_HEADER: str(len(whole))})
    assert seen["before the start"] == (whole, {SIZE_HEADER: str(len(whole))})  # read from its start
