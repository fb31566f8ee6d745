"""Volumes against the real platform: a 300 MB volume is put over HTTP (chunks to JetStream's object store),
fetched once by the node, checked, and read by a replica at its mount path (read-only); an interrupted put
resumes without sending stored chunks again; a chunk corrupted in the node's cache is found by its hash and
fetched again; and the attacks: file paths that climb out of a volume (at the platform and at the node), mount
paths over the system, a chunk whose hash is wrong or too big, a token without the scope, another app's volume."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import nats
import pytest
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from support.auth import bearer
from support.natsconn import connect as admin_connect
from support.natsconn import ends_refused
from support.owners import owners_of
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import InvalidInputError, InvalidSpecError
from ember._volume import CHUNKS_PATH, PutProgress, chunks_of, put_volume
from ember.wire import VolumeVersion, encoder, subjects
from ember.wire.natscreds import read_file
from ember.wire.volumes import VolumeFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
MB = 1024 * 1024

READER = '''import hashlib, os
import ember
app = ember.App("{app}")

@app.function(volumes={{"/weights": ember.Volume("{volume}")}}, timeout_s=120)
def digest(name: str) -> dict:
    path = os.path.join(ember.mounted("/weights"), name)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    try:
        open(path, "ab").close()
        writable = True
    except OSError:
        writable = False
    return {{"sha256": h.hexdigest(), "size": os.path.getsize(path), "writable": writable,
            "files": sorted(os.listdir(ember.mounted("/weights")))}}
'''


def _app(tmp_path: Path, app: str, volume: str) -> Path:
    folder = tmp_path / app
    folder.mkdir()
    path = folder / f"{app.replace('-', '_')}.py"
    path.write_text(READER.format(app=app, volume=volume))
    return path


def _random_file(path: Path, size: int) -> str:
    """A file of ``size`` random bytes, written a block at a time; its sha256."""
    h = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(0, size, 4 * MB):
            block = os.urandom(min(4 * MB, size - fh.tell()))
            fh.write(block)
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def big(platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A 300 MB volume (one big file and a small one in a folder), put once: its name and the big file's sha256."""
    folder = tmp_path_factory.mktemp("vol") / "weights"
    (folder / "sub").mkdir(parents=True)
    digest = _random_file(folder / "big.bin", 300 * MB)
    (folder / "sub" / "small.txt").write_text("hello")
    name = f"big-{uuid.uuid4().hex[:6]}"
    with _transport(platform) as t:
        seen: list[PutProgress] = []
        view = put_volume(name, [folder], transport=t, progress=lambda p: seen.append(
            PutProgress(p.total_bytes, p.done_bytes, p.skipped_bytes, p.sent_chunks, p.skipped_chunks)))
        assert view.version == 1 and view.file_count == 2 and view.size == 300 * MB + 5
        assert seen[-1].done_bytes == seen[-1].total_bytes == 300 * MB + 5 and len(seen) > 10  # a progress bar
    folder.joinpath("big.bin").unlink()
    yield name, digest


class _transport:
    """A transport to the session's platform, with its admin token or ``token``, closed on leaving."""

    def __init__(self, platform, token: str | None = None) -> None:  # type: ignore[no-untyped-def]
        self.t = Transport(platform.url, token=token or platform.token)

    def __enter__(self) -> Transport:
        return self.t

    def __exit__(self, *exc: object) -> None:
        self.t.close()


@pytest.fixture(scope="module")
def reader(platform, big: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An app whose replica reads the big volume at /weights."""
    app = f"vol-reader-{uuid.uuid4().hex[:4]}"
    with _transport(platform) as t:
        deploy(_app(tmp_path_factory.mktemp("apps"), app, big[0]), transport=t, timeout_s=180)
    yield app
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as http:
        http.delete(f"/v1/apps/{app}")


def _cache(platform, volume: str) -> Path:  # type: ignore[no-untyped-def]
    return Path(platform.state_dir) / "node" / "volumes" / f"{volume}@v1"


def test_a_300mb_volume_is_put_fetched_verified_and_read_by_a_replica(platform, http: httpx.Client, big, reader):
    name, digest = big
    answer = http.post(f"/v1/{reader}/digest", json="big.bin", timeout=120)
    assert answer.status_code == 200, answer.text
    # In a sandbox the mount is read-only (EROFS, even for root); without one, the cache's files are read-only.
    sandboxed = "replicas run WITHOUT a sandbox" not in (Path(platform.log_dir) / "agent.log").read_text()
    writable = not sandboxed and os.geteuid() == 0
    assert answer.json() == {"sha256": digest, "size": 300 * MB, "writable": writable, "files": ["big.bin", "sub"]}
    small = http.post(f"/v1/{reader}/digest", json="sub/small.txt").json()
    assert small["sha256"] == hashlib.sha256(b"hello").hexdigest()

    cached = _cache(platform, name) / "big.bin"
    assert cached.stat().st_size == 300 * MB and not cached.stat().st_mode & stat.S_IWUSR  # read-only, agent's
    nodes = http.get("/v1/status").json()["nodes"]
    listed = http.get(f"/v1/volumes/{name}").json()
    assert listed["used_by"] == [reader] and [f["path"] for f in listed["files"]] == ["big.bin", "sub/small.txt"]
    assert http.delete(f"/v1/volumes/{name}").status_code == 409  # mounted by a current version
    assert nodes  # the node is up; it reports the volume with its next heartbeat (placement prefers it)
    wait_for(lambda: f"{name}@v1" in asyncio.run(_node_volumes(platform.nats_url)), 15, "the node to report it")


async def _node_volumes(url: str) -> list[str]:
    nc = await admin_connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.NODES_BUCKET)
        found: list[str] = []
        try:
            keys = await kv.keys()
        except NoKeysError:  # no node's info at this moment (one whose heartbeat came late): ask again
            return found
        for key in keys:
            found += msgspec.json.decode((await kv.get(key)).value).get("volumes", [])
        return found
    finally:
        await nc.close()


def test_a_corrupted_chunk_in_the_nodes_cache_is_found_and_fetched_again(platform, http: httpx.Client, big,
                                                                         reader, tmp_path: Path) -> None:
    name, digest = big
    cached = _cache(platform, name) / "big.bin"
    os.chmod(cached, 0o644)
    with cached.open("r+b") as fh:  # one byte of the 13th chunk flipped
        fh.seek(100 * MB)
        byte = fh.read(1)
        fh.seek(100 * MB)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(cached, 0o444)
    second = f"vol-second-{uuid.uuid4().hex[:4]}"
    with _transport(platform) as t:
        deploy(_app(tmp_path, second, name), transport=t, timeout_s=180)  # a new replica: the cache is checked
    try:
        assert http.post(f"/v1/{second}/digest", json="big.bin", timeout=120).json()["sha256"] == digest
        log = (Path(platform.log_dir) / "agent.log").read_text()
        assert f"volume {name}@v1: chunk" in log and "fails its hash check: fetching it again" in log
        with cached.open("rb") as fh:
            fh.seek(96 * MB)
            assert hashlib.sha256(fh.read(8 * MB)).hexdigest() == _chunk_sha(platform, name, 12)
    finally:
        http.delete(f"/v1/apps/{second}")


def _chunk_sha(platform, name: str, index: int) -> str:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token)) as http:
        assert http.get(f"/v1/volumes/{name}").status_code == 200
    return asyncio.run(_version(platform.nats_url, name, 1)).files[0].chunks[index]


async def _version(url: str, name: str, version: int) -> VolumeVersion:
    nc = await admin_connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.VOLUMES_BUCKET)
        return msgspec.json.decode((await kv.get(f"{name}.{version}")).value, type=VolumeVersion)
    finally:
        await nc.close()


def test_an_interrupted_put_resumes_without_sending_stored_chunks_again(platform, http: httpx.Client,
                                                                        tmp_path: Path) -> None:
    source = tmp_path / "model.bin"
    _random_file(source, 60 * MB)  # 8 chunks of 8 MiB
    hashes = [sha for sha, _ in chunks_of(source, 8 * MB)]
    name = f"resume-{uuid.uuid4().hex[:6]}"

    def interrupt(p: PutProgress) -> None:
        if p.sent_chunks >= 3:
            raise KeyboardInterrupt("the user pressed ^C")

    with _transport(platform) as t:
        with pytest.raises(KeyboardInterrupt):
            put_volume(name, [source], transport=t, progress=interrupt, workers=1)
        stored = len(hashes) - len(http.post(f"{CHUNKS_PATH}/missing", json={"chunks": hashes}).json()["missing"])
        assert 3 <= stored < len(hashes)
        assert http.get(f"/v1/volumes/{name}").status_code == 404  # nothing committed
        last: list[PutProgress] = []
        view = put_volume(name, [source], transport=t, progress=last.append)
    assert view.version == 1 and view.size == 60 * MB
    assert last[-1].skipped_chunks == stored and last[-1].sent_chunks == len(hashes) - stored
    with _transport(platform) as t:
        again = put_volume(name, [source], transport=t)
    assert again.version == 2  # a new version of the same bytes sends nothing
    assert http.delete(f"/v1/volumes/{name}").status_code == 204
    assert http.get(f"/v1/volumes/{name}").status_code == 404
    assert len(http.post(f"{CHUNKS_PATH}/missing", json={"chunks": hashes}).json()["missing"]) == len(hashes)


def _put_chunk(http: httpx.Client, data: bytes) -> str:
    """Store ``data`` as a chunk (or find it stored); its sha256."""
    sha = hashlib.sha256(data).hexdigest()
    assert http.put(f"{CHUNKS_PATH}/{sha}", content=data).status_code in (200, 201)
    return sha


def test_file_paths_that_climb_out_of_a_volume_are_refused(http: httpx.Client) -> None:
    data = b"x" * 10
    sha = _put_chunk(http, data)
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b", "a//b", "./a", "a/.", "a\\..\\b", "a\x00b", ""):
        answer = http.post("/v1/volumes/evil/versions", json={"files": [{"path": bad, "size": 10, "chunks": [sha]}]})
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"]["field"] == "$.files[0].path"
    clash = [{"path": "a", "size": 10, "chunks": [sha]}, {"path": "a/b", "size": 10, "chunks": [sha]}]
    assert http.post("/v1/volumes/evil/versions", json={"files": clash}).status_code == 422
    lying = http.post("/v1/volumes/evil/versions", json={"files": [{"path": "a", "size": 11, "chunks": [sha]}]})
    assert lying.status_code == 422 and lying.json()["error"]["field"] == "$.files[0].size"
    missing = http.post("/v1/volumes/evil/versions", json={"files": [{"path": "a", "size": 1, "chunks": ["0" * 64]}]})
    assert missing.status_code == 409 and missing.json()["error"]["field"] == "$.files[0].chunks[0]"
    assert http.get("/v1/volumes/evil").status_code == 404


def test_a_node_refuses_a_version_whose_paths_climb_out(platform, http: httpx.Client, tmp_path: Path) -> None:
    """A version written to the bucket behind the platform's back (as only the control plane could): the node
    checks every path itself before it writes, and the replica is not started."""
    data = b"owned"
    sha = _put_chunk(http, data)
    name = f"sneaky-{uuid.uuid4().hex[:6]}"
    ok = http.post(f"/v1/volumes/{name}/versions", json={"files": [{"path": "fine", "size": 5, "chunks": [sha]}]})
    assert ok.status_code == 201, ok.text
    escape = Path(platform.state_dir) / "node" / "escaped"
    hostile = VolumeVersion(name=name, version=1, size=5, created_at=0.0,
                            files=[VolumeFile(path="../../escaped", size=5, chunks=[sha])])
    asyncio.run(_overwrite(platform.nats_url, f"{name}.1", encoder.encode(hostile)))
    app = f"sneaky-app-{uuid.uuid4().hex[:4]}"
    with _transport(platform) as t:
        deploy(_app(tmp_path, app, name), transport=t, wait=False)
    wait_for(lambda: "file path" in http.get(f"/v1/apps/{app}").text, 30, "the replica to say why it cannot start")
    http.delete(f"/v1/apps/{app}")
    assert not escape.exists() and not _cache(platform, name).exists()


async def _overwrite(url: str, key: str, value: bytes) -> None:
    nc = await admin_connect(url)
    try:
        await (await nc.jetstream().key_value(subjects.VOLUMES_BUCKET)).put(key, value)
    finally:
        await nc.close()


def test_chunks_whose_hash_or_size_is_wrong_are_refused(http: httpx.Client) -> None:
    data = os.urandom(1000)
    wrong = http.put(f"{CHUNKS_PATH}/{'a' * 64}", content=data)
    assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "$body"
    assert http.post(f"{CHUNKS_PATH}/missing", json={"chunks": ["a" * 64]}).json()["missing"] == ["a" * 64]
    assert http.put(f"{CHUNKS_PATH}/not-a-hash", content=data).status_code == 422
    big = b"\0" * (8 * MB + 1)
    too_big = http.put(f"{CHUNKS_PATH}/{hashlib.sha256(big).hexdigest()}", content=big)
    assert too_big.status_code == 413
    bad_query = http.post(f"{CHUNKS_PATH}/missing", json={"chunks": ["../x"]})
    assert bad_query.status_code == 422 and bad_query.json()["error"]["field"] == "$.chunks[0]"


def test_mount_paths_over_system_folders_are_refused(http: httpx.Client, tmp_path: Path) -> None:
    import ember

    for bad in ("/", "/usr", "/usr/lib/x", "/proc", "/etc/ssl", "/home", "/bundle", "/tmp/w", "weights", "/a/../b",
                "/a//b", "/w/"):
        with pytest.raises(InvalidSpecError, match=re.escape(f"mount path {bad!r}")):  # this refusal, no other
            ember.App("x").function(volumes={bad: ember.Volume("w")})
    manifest = {"app": "mounty", "module": "mounty", "services": [{
        "name": "f", "kind": "function", "functions": [{"name": "f", "attr": "f", "input_mode": "none"}],
        "volumes": [{"path": "/proc/self", "name": "w"}]}]}
    answer = http.post("/v1/apps/mounty/deployments", json={"bundle_sha256": "0" * 64, "manifest": manifest})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == "$.manifest.services[0].volumes[0].path"


def test_scopes_and_app_patterns_hold_for_volumes(platform, http: httpx.Client, tmp_path: Path) -> None:
    def token(scopes: list[str], apps: list[str]) -> dict[str, str]:
        made = http.post("/v1/tokens", json={"scopes": scopes, "apps": apps, "name": f"vol-{uuid.uuid4().hex[:6]}"})
        assert made.status_code == 201, made.text
        return bearer(made.json()["token"])

    data = b"team b's weights"
    sha = _put_chunk(http, data)
    other = f"team-b-{uuid.uuid4().hex[:6]}"
    files = {"files": [{"path": "w.bin", "size": len(data), "chunks": [sha]}]}
    assert http.post(f"/v1/volumes/{other}/versions", json=files).status_code == 201

    reader_, team_a = token(["read"], ["*"]), token(["deploy"], ["team-a-*"])
    with httpx.Client(base_url=platform.url, timeout=60) as anon:
        assert anon.get("/v1/volumes").status_code == 401
        assert anon.get("/v1/volumes", headers=token(["invoke"], ["*"])).status_code == 403
        assert anon.get("/v1/volumes", headers=reader_).status_code == 200
        assert anon.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=reader_).status_code == 403
        assert anon.post(f"/v1/volumes/{other}/versions", json=files, headers=reader_).status_code == 403
        assert anon.delete(f"/v1/volumes/{other}", headers=reader_).status_code == 403

        assert other not in [v["name"] for v in anon.get("/v1/volumes", headers=team_a).json()]
        assert anon.get(f"/v1/volumes/{other}", headers=team_a).status_code == 404
        assert anon.delete(f"/v1/volumes/{other}", headers=team_a).status_code == 404
        assert anon.post(f"/v1/volumes/{other}/versions", json=files, headers=team_a).status_code == 403
        mine = f"team-a-{uuid.uuid4().hex[:6]}"
        assert anon.post(f"/v1/volumes/{mine}/versions", json=files, headers=team_a).status_code == 201
        assert [v["name"] for v in anon.get("/v1/volumes", headers=team_a).json()] == [mine]

        app = f"team-a-app-{uuid.uuid4().hex[:4]}"  # an app of team a mounting team b's volume: as if it did not exist
        with pytest.raises(InvalidInputError, match=f"volume '{other}' does not exist"), \
                _transport(platform, team_a["Authorization"].split()[1]) as t:
            deploy(_app(tmp_path, app, other), transport=t, timeout_s=60)

        spy = f"team-b-app-{uuid.uuid4().hex[:4]}"  # team b's app (pushed by an admin) mounting team a's volume
        with _transport(platform) as t:
            deploy(_app(tmp_path, spy, mine), transport=t, timeout_s=120)
        try:
            assert anon.get(f"/v1/volumes/{mine}", headers=team_a).json()["used_by"] == []  # not named to team a
            refused = anon.delete(f"/v1/volumes/{mine}", headers=team_a)
            assert refused.status_code == 409 and spy not in refused.text, refused.text  # nor how many there are
            assert "apps this token does not see" in refused.text and "1 other" not in refused.text, refused.text
            assert http.get(f"/v1/volumes/{mine}").json()["used_by"] == [spy]
        finally:
            http.delete(f"/v1/apps/{spy}")
    assert http.get(f"/v1/volumes/{other}").json()["version"] == 1  # untouched
    http.delete(f"/v1/volumes/{other}")
    wait_for(lambda: http.delete(f"/v1/volumes/{mine}").status_code == 204, 30, "the volume to be removed")


def test_the_cli_puts_lists_and_removes_a_volume(platform, ember_cli, tmp_path: Path) -> None:
    def cli(*args: str, check: bool = True):  # type: ignore[no-untyped-def]
        return ember_cli(*args, url=platform.url, check=check)

    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.pt").write_bytes(os.urandom(3 * MB))
    (tmp_path / "tok.json").write_text("{}")
    name = f"cli-{uuid.uuid4().hex[:6]}"
    put = cli("volume", "put", name, str(tmp_path / "w"), str(tmp_path / "tok.json"))
    assert f"volume {name}: version 1, 2 file(s)" in put.stdout
    assert f"{name} [" in put.stderr and "100%" in put.stderr  # the progress bar
    again = cli("volume", "put", name, str(tmp_path / "w"), str(tmp_path / "tok.json"))
    assert "version 2" in again.stdout and "already stored" in again.stderr  # nothing sent twice
    listed = cli("volume", "ls")
    assert name in listed.stdout
    shown = cli("volume", "ls", name).stdout
    assert "model.pt" in shown and "tok.json" in shown and "kept: 1, 2" in shown
    assert f"removed volume {name}" in cli("volume", "rm", name).stdout
    gone = cli("volume", "ls", name, check=False)
    assert gone.returncode == 1 and "NotFoundError" in gone.stderr
    bad = cli("volume", "put", "Bad_Name", str(tmp_path / "w"), check=False)
    assert bad.returncode == 1 and "volume name" in bad.stderr


def test_a_node_agent_cannot_read_or_change_volumes_directly(platform, http: httpx.Client) -> None:
    """A node reads the volumes of its replicas through a control plane (test_node_reads); the stores themselves
    are closed to it: no read of a version, no write, no delete, no word on who owns a chunk."""
    data = b"weights a node may read"
    sha = _put_chunk(http, data)
    name = f"ro-{uuid.uuid4().hex[:6]}"
    files = {"files": [{"path": "w", "size": len(data), "chunks": [sha]}]}
    assert http.post(f"/v1/volumes/{name}/versions", json=files).status_code == 201
    creds = read_file(platform.node_credentials("vol-spy"))

    async def as_a_node() -> list[bool]:
        violations: list[str] = []

        async def on_error(exc: Exception) -> None:
            violations.append(str(exc))

        nc = await nats.connect(platform.nats_url, name="vol-spy", error_cb=on_error, **creds.connect_options())
        refused = []
        try:
            js = nc.jetstream(timeout=2)  # a refused request is answered by nothing: each waits this long
            # opened by name (a node may not ask about these streams: their info would list their keys)
            kv = KeyValue(name=subjects.VOLUMES_BUCKET, stream=f"KV_{subjects.VOLUMES_BUCKET}",
                          pre=f"$KV.{subjects.VOLUMES_BUCKET}.", js=js, direct=True)
            store = ObjectStore(name=subjects.VOLUME_CHUNKS_STORE, stream="OBJ_ember_volume_chunks", js=js)
            for attempt in (kv.get(f"{name}.1"), kv.put(f"{name}.1", b"{}"), kv.delete(f"{name}.1"),
                            store.delete(sha), store.put(sha, b"other bytes"),
                            js.purge_stream("OBJ_ember_volume_chunks"),
                            js.publish(f"$KV.{subjects.OWNERS_BUCKET}.chunk.{sha}", b'["node-*"]')):
                said = len(violations)
                # The refusal, and only it: the server drops the request and says so (a permissions violation
                # for that publish). An answer counts as no refusal; any other error fails the test as itself.
                refused.append(await ends_refused(attempt, violations) and any(
                    "permissions violation for publish" in v.lower() for v in violations[said:]))
            return refused
        finally:
            await nc.close()

    refused = asyncio.run(as_a_node())
    assert refused == [True] * 7, refused  # it may read nothing, change nothing, nor say who owns a chunk
    assert http.get(f"/v1/volumes/{name}").json()["version"] == 1
    assert owners_of(platform.nats_url, "chunk", sha) == ["*"]
    assert http.post(f"{CHUNKS_PATH}/missing", json={"chunks": [sha]}).json()["missing"] == []
    http.delete(f"/v1/volumes/{name}")


def test_a_node_refuses_a_chunk_whose_bytes_are_not_its_address(platform, http: httpx.Client,
                                                                  tmp_path: Path) -> None:
    """A chunk swapped in the store behind the platform's back (as only the control plane could): the node hashes
    what it fetched, refuses it, and the replica is not started."""
    meant, swapped = b"the weights", b"evil bytes!"
    sha = hashlib.sha256(meant).hexdigest()
    asyncio.run(_store_object(platform.nats_url, sha, swapped))  # same size, other bytes
    name = f"swapped-{uuid.uuid4().hex[:6]}"
    files = {"files": [{"path": "w", "size": len(meant), "chunks": [sha]}]}
    assert http.post(f"/v1/volumes/{name}/versions", json=files).status_code == 201
    app = f"swapped-app-{uuid.uuid4().hex[:4]}"
    with _transport(platform) as t:
        deploy(_app(tmp_path, app, name), transport=t, wait=False)
    wait_for(lambda: "hashes to" in http.get(f"/v1/apps/{app}").text, 30, "the replica to say why it cannot start")
    http.delete(f"/v1/apps/{app}")
    assert not _cache(platform, name).exists()
    wait_for(lambda: http.delete(f"/v1/volumes/{name}").status_code == 204, 30, "the volume to be removed")


async def _store_object(url: str, name: str, data: bytes) -> None:
    nc = await admin_connect(url)
    try:
        await (await nc.jetstream().object_store(subjects.VOLUME_CHUNKS_STORE)).put(name, data)
    finally:
        await nc.close()


PLAIN = '''import ember
app = ember.App("{app}")

@app.function()
def digest(name: str) -> dict:
    return {{}}
'''


def test_a_volume_mounted_by_the_version_still_serving_is_not_removed(platform, http: httpx.Client, tmp_path: Path):
    """A canary without the volume: the stable version still mounts it and takes calls. Removing it was a 204 (the
    version rolled out alone was looked at), and its chunks went from under the serving replicas."""
    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "w.txt").write_text("weights")
    name, app = f"kept-{uuid.uuid4().hex[:6]}", f"vol-canary-{uuid.uuid4().hex[:4]}"
    with _transport(platform) as t:
        put_volume(name, [folder], transport=t)
        source = _app(tmp_path, app, name)
        deploy(source, transport=t, timeout_s=180)
        source.write_text(PLAIN.format(app=app))
        deploy(source, transport=t, timeout_s=180, canary_percent=10)
    try:
        refused = http.delete(f"/v1/volumes/{name}")
        assert refused.status_code == 409 and app in refused.text, refused.text
        assert http.get(f"/v1/volumes/{name}").status_code == 200
    finally:
        http.delete(f"/v1/apps/{app}")
        wait_for(lambda: http.delete(f"/v1/volumes/{name}").status_code in (200, 204), 60, "the volume to go")
