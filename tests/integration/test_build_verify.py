"""A node's answer to a build is held to the manifest the pushing machine declared: a node (its own NATS
credentials) that answers with a rewritten manifest (another team's secret, another app's subject) fails the build,
naming the field, and nothing of its answer can be deployed; an honest build of the same app deploys.

The real node works on the same build meanwhile, but its image's index is a port that never answers, so the forged
answer is the one that comes first.

The node imports the pushed app (a tenant's code, on a node other tenants' replicas share) within its build's memory
(``--build-memory-mb``): past it, the push fails saying so, and the node builds the next push."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import nats
import pytest
from support import natsconn
from support.platform import TestPlatform
from support.polling import wait_for
from support.wheels import PACKAGE, write_wheel

import ember
from ember._build import plan_images
from ember._bundle import build_bundle
from ember._client import Transport
from ember._errors import InvalidSpecError
from ember.wire import Deployment, Manifest, encoder, natsflush, subjects
from ember.wire.builds import BuildStart
from ember.wire.images import BuildEvent, image_hash
from ember.wire.natscreds import read_file

pytestmark = pytest.mark.integration
BUILD_MEMORY_MB = 256  # what this platform's node lets a build's import use (a plain app's import: under 64)

APP = '''
import ember
import {package}                      # only the image has it

image = ember.Image({index}).pip_install("{package}==1.0")
app = ember.App({app!r}, image=image)


@app.function(min_replicas=0, secrets=["{app}-db"], on=["events.{app}.in"])
def report(text: str) -> str:
    return {package}.__version__ + text
'''


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    write_wheel(folder, version="1.0")
    return folder


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[TestPlatform]:
    state = tmp_path_factory.mktemp("ember-build-verify")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBER_IMAGE_LOCAL_INDEXES", str(wheels))
        env.setenv("EMBER_BUILD_MEMORY_MB", str(BUILD_MEMORY_MB))
        with TestPlatform(state) as running:
            yield running


@pytest.fixture(scope="module")
def http(node: TestPlatform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=30) as c:
        for name in ("verify-a-db", "verify-b-db"):
            made = c.put(f"/v1/secrets/{name}", json={"values": {"K": name}, "apps": ["verify-*"]})
            assert made.status_code in (200, 201), made.text
        yield c


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index URL whose port takes connections and never answers: a build that needs it does not finish."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple"


def _write(folder: Path, app: str, index: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "verify_app.py"
    path.write_text(APP.format(package=PACKAGE, app=app, index=index))
    return path


def _start(node: TestPlatform, http: httpx.Client, path: Path, **body: object) -> httpx.Response:
    found = plan_images(path)
    bundle = build_bundle(path.parent)
    assert http.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data,
                    headers={"content-type": "application/gzip"}).status_code in (200, 201)
    start = BuildStart(bundle_sha256=bundle.sha256, module=found.module, images=found.images,
                       inspect_in=found.inspect_in, declared=found.declared)
    raw = {**msgspec.to_builtins(start), **body}
    return http.post(f"/v1/apps/{found.app}/builds", json=raw)


def _forged(declared: Manifest) -> Manifest:
    """The declared manifest as a hostile node returns it: its image locked (validly), another team's secret."""
    image = declared.services[0].image
    assert image is not None
    locked = msgspec.structs.replace(image, python="3.11", lock=f"{PACKAGE}==1.0 \\\n    --hash=sha256:{'a' * 64}\n")
    locked = msgspec.structs.replace(locked, sha256=image_hash(locked))
    service = msgspec.structs.replace(declared.services[0], image=locked, secrets=["verify-b-db"])
    return msgspec.structs.replace(declared, services=[service])


async def _answer_as_the_node(node: TestPlatform, node_id: str, event: BuildEvent) -> None:
    creds = read_file(node.state_dir / "nats-creds" / f"{node_id}.creds")
    nc = await nats.connect(node.nats_url, **creds.connect_options())
    try:
        await nc.publish(subjects.node_build_events(node_id), encoder.encode(event))
        await natsflush.flush(nc)
    finally:
        await nc.close()


async def _deployed(node: TestPlatform, app: str) -> Manifest:
    """The deployed manifest, as the control plane stores it."""
    nc = await natsconn.connect(node.nats_url)
    try:
        kv = await nc.jetstream().key_value("ember_deployments")
        return msgspec.json.decode((await kv.get(app)).value, type=Deployment).manifest
    finally:
        await nc.close()


@pytest.mark.timeout(300)
def test_a_node_that_rewrites_the_manifest_fails_the_build_naming_the_field(tmp_path, node, http, silent_index):
    path = _write(tmp_path / "a", "verify-a", f"index_url={silent_index!r}")
    started = _start(node, http, path)
    assert started.status_code == 202, started.text
    build_id, node_id = started.json()["build_id"], started.json()["node_id"]
    declared = plan_images(path).declared
    assert declared is not None
    forged = encoder.encode(_forged(declared)).decode()
    asyncio.run(_answer_as_the_node(node, node_id, BuildEvent(build_id=build_id, state="ready",
                                                              manifest_json=forged)))
    view = wait_for(lambda: (v := http.get(f"/v1/apps/verify-a/builds/{build_id}").json())["state"] != "building"
                    and v["state"] != "queued" and v, timeout_s=60, what="the forged answer to be judged")
    assert view["state"] == "failed", view
    assert view["error"] == "the node's manifest differs from the one pushed at $.services[0].secrets"
    assert view["manifest_json"] == ""  # nothing of the node's answer to deploy
    log = node.log_dir / "platform.log"
    wait_for(lambda: any(node_id in line and "$.services[0].secrets" in line
                         for line in log.read_text(errors="replace").splitlines()),
             timeout_s=30, what="the refusal logged with the node's id")
    assert http.get("/v1/apps/verify-a").status_code == 404  # never deployed


@pytest.mark.timeout(300)
def test_only_the_node_asked_may_answer_a_build(tmp_path, node, http, silent_index):
    """Another node (credentials of its own) answering a build, even with the declared manifest honestly locked, is
    not heard: on its own subject it speaks for no build asked of it, and the asked node's subject is not its to
    publish on."""
    path = _write(tmp_path / "d", "verify-a", f"index_url={silent_index!r}")
    started = _start(node, http, path)
    assert started.status_code == 202, started.text
    build_id, node_id = started.json()["build_id"], started.json()["node_id"]
    declared = plan_images(path).declared
    assert declared is not None
    honest = msgspec.structs.replace(_forged(declared), services=[
        msgspec.structs.replace(_forged(declared).services[0], secrets=declared.services[0].secrets)])
    answer = BuildEvent(build_id=build_id, state="ready", manifest_json=encoder.encode(honest).decode())
    forger = read_file(node.node_credentials("forger"))

    async def forge() -> str:
        nc = await nats.connect(node.nats_url, **forger.connect_options())
        try:
            await nc.publish(subjects.node_build_events("forger"), encoder.encode(answer))
            await natsflush.flush(nc)
            await nc.publish(subjects.node_build_events(node_id), encoder.encode(answer))
            await natsflush.flush(nc)
            await wait_until_error(nc)
            return repr(nc.last_error)
        finally:
            await nc.close()

    async def wait_until_error(nc: nats.NATS) -> None:
        while nc.last_error is None:
            await asyncio.sleep(0.05)

    assert "permissions violation" in asyncio.run(asyncio.wait_for(forge(), 30)).lower()
    # the asked node's next word comes after the forger's (flushed) ones: once it shows, they were judged
    asyncio.run(_answer_as_the_node(node, node_id, BuildEvent(build_id=build_id, lines=["after the forger"])))
    view = wait_for(lambda: (v := http.get(f"/v1/apps/verify-a/builds/{build_id}").json())
                    and "after the forger" in v["lines"] and v, timeout_s=60, what="the node's own line")
    assert view["state"] == "building" and view["manifest_json"] == "", view


def test_a_build_without_the_declared_manifest_or_with_another_apps_is_refused(tmp_path, node, http, silent_index):
    path = _write(tmp_path / "b", "verify-a", f"index_url={silent_index!r}")
    missing = _start(node, http, path, declared=None)
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "$.declared", missing.text
    declared = plan_images(path).declared
    assert declared is not None
    theirs = msgspec.to_builtins(msgspec.structs.replace(declared, app="verify-b"))
    other = _start(node, http, path, declared=theirs)
    assert other.status_code == 422 and other.json()["error"]["field"] == "$.declared.app", other.text


@pytest.mark.timeout(300)
def test_an_import_past_the_builds_memory_fails_the_push(tmp_path, node, http, wheels):
    """An app that holds twice the build's memory once imported: its push fails, naming the limit (a MemoryError
    under the rlimit, the import killed in a memory cgroup), and nothing is deployed; the honest build below is the
    node's next."""
    path = _write(tmp_path / "hog", "verify-hog", f"find_links=[{str(wheels)!r}], no_index=True")
    path.write_text(path.read_text().replace("\nimage = ", f"\nHELD = bytearray({2 * BUILD_MEMORY_MB} << 20)\n"
                                             "image = "))
    client = Transport(node.url, token=node.token)
    try:
        with pytest.raises(InvalidSpecError) as failed:
            ember.deploy(path, transport=client, wait=False)
        assert f"may use {BUILD_MEMORY_MB} MiB of memory" in str(failed.value), str(failed.value)
        assert http.get("/v1/apps/verify-hog").status_code == 404
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_an_honest_build_deploys_the_declared_manifest(tmp_path, node, http, wheels):
    path = _write(tmp_path / "c", "verify-a", f"find_links=[{str(wheels)!r}], no_index=True")
    client = Transport(node.url, token=node.token)
    try:
        assert ember.deploy(path, transport=client, wait=False).app == "verify-a"
        service = asyncio.run(_deployed(node, "verify-a")).services[0]
        assert service.secrets == ["verify-a-db"] and service.functions[0].on == ["events.verify-a.in"]
        assert service.image is not None and service.image.lock.startswith(PACKAGE)
    finally:
        http.delete("/v1/apps/verify-a")
        client.close()
